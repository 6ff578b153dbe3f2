package httpgate

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/policy"
)

// holdSlots keeps the concurrency slots of v, an admitted verdict of r,
// while r waits for its turn and runs: each lease is renewed every half
// lease (sluice.Lease.Keep), so a request that runs longer than its
// lease keeps its slot. The returned function stops the renewals and
// releases the slots; the middleware defers it, so it runs however the
// handler ends.
func (g *Gate) holdSlots(r *http.Request, v *policy.Verdict) func() {
	leases := v.Leases()
	if len(leases) == 0 {
		return func() {}
	}
	stops := make([]func(), len(leases))
	for i, ls := range leases {
		stops[i] = ls.Keep(func(d sluice.Decision, err error) {
			if err != nil {
				g.storeLog.Log(g.opts.Logger, ls.Limit().Name(), ls.Key(), fmt.Errorf("renewing a concurrency slot's lease: %w", err), false)
				return
			}
			g.opts.Logger.Warn("a request that ran past its lease lost its concurrency slot (the lease ended before it was renewed, and the slots were taken)",
				"rule", ls.Limit().Name(), "key", ls.Key(), "lease", ls.Limit().LeaseTerm())
		})
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
		// r's context may be done (a client that went away): Release
		// runs on a context of its own, keeping r's values.
		if err := v.Release(r.Context()); err != nil {
			g.storeLog.Log(g.opts.Logger, "concurrency", "", fmt.Errorf("releasing concurrency slots (each is freed when its lease ends): %w", err), false)
		}
	}
}

// writeUnsupported answers a request refused because a concurrency rule
// matched it on a path that cannot hold a slot (forward auth): a 500, not
// a 429, since no wait would ever admit it and the fix is the operator's.
func writeUnsupported(w http.ResponseWriter, v policy.Verdict) {
	var names []string
	for i := range v.Results {
		if r := &v.Results[i]; r.Refused() && r.Reason() == policy.ReasonConcurrencyUnsupported {
			names = append(names, fmt.Sprintf("%q", r.Match.Request.Limit.Name()))
		}
	}
	w.Header().Del("Retry-After")
	writeProblem(w, Problem{
		Status: http.StatusInternalServerError,
		Detail: "the concurrency rule " + strings.Join(names, ", ") + " cannot be enforced here: forward auth is asked before a request and never told when it ends, so it cannot hold a slot; the rule is enforced by sluice's reverse proxy and Go middleware",
		Reason: policy.ReasonConcurrencyUnsupported,
	})
}

// ReleaseRequest is the body of /v1/release and /v1/renew: the rule and
// key a take acquired a concurrency slot of, and the lease it returned.
type ReleaseRequest struct {
	Rule  string `json:"rule"`
	Key   string `json:"key"`
	Lease string `json:"lease"`
}

// ReleaseResponse is the answer of /v1/release.
type ReleaseResponse struct {
	// Released reports whether the lease held a slot: false for a lease
	// already released, one whose time ran out, or one never acquired
	// under this rule and key.
	Released bool   `json:"released"`
	Rule     string `json:"rule"`
	// Limit is the rule's max_in_flight; Remaining the slots free after
	// the release.
	Limit        int64 `json:"limit"`
	Remaining    int64 `json:"remaining"`
	ResetAfterMs int64 `json:"reset_after_ms"`
}

// RenewResponse is the answer of /v1/renew.
type RenewResponse struct {
	// Renewed reports whether the lease held a slot, which it now holds
	// for LeaseMs from now; false for a lease already released, one whose
	// time ran out, or one never acquired under this rule and key, which
	// holds nothing still (a new /v1/take may find a slot).
	Renewed bool   `json:"renewed"`
	Rule    string `json:"rule"`
	LeaseMs int64  `json:"lease_ms"`
	// Limit is the rule's max_in_flight; Remaining the slots free.
	Limit        int64 `json:"limit"`
	Remaining    int64 `json:"remaining"`
	ResetAfterMs int64 `json:"reset_after_ms"`
}

// leaseCall reads and checks the body of /v1/release or /v1/renew (what
// names the call in its problems) and makes the store call; it answers
// the problems itself and reports whether d is the store's answer.
func (g *Gate) leaseCall(w http.ResponseWriter, r *http.Request, what string, call func(context.Context, sluice.Request, engine.LeaseID) (sluice.Decision, error)) (lim *sluice.Limit, d sluice.Decision, ok bool) {
	var body ReleaseRequest
	if !decodeBody(w, r, &body) {
		return nil, d, false
	}
	p := g.Policy()
	m, ie := matchFor(p, TakeItem{Rule: body.Rule, Key: body.Key})
	if ie != nil {
		badRequest(w, ie.status, ie.msg)
		return nil, d, false
	}
	lim = m.Request.Limit
	if lim.Algorithm() != sluice.Concurrency {
		badRequest(w, http.StatusBadRequest, fmt.Sprintf("%q is a %s rule: only a concurrency rule's take returns a lease to %s", lim.Name(), lim.Algorithm(), what))
		return nil, d, false
	}
	if body.Lease == "" {
		badRequest(w, http.StatusBadRequest, `"lease" is required: the lease /v1/take returned with the slot`)
		return nil, d, false
	}
	id, err := engine.ParseLeaseID(body.Lease)
	if err != nil {
		badRequest(w, http.StatusBadRequest, `"lease" must be the 32 hexadecimal digits /v1/take returned with the slot`)
		return nil, d, false
	}
	ctx, cancel := deadline.WithTimeout(r.Context(), g.opts.StoreTimeout)
	defer cancel()
	d, err = call(ctx, m.Request, id)
	if err != nil {
		// The store's error names its address: it goes to the log.
		g.storeLog.Log(g.opts.Logger, lim.Name(), body.Key, err, false)
		badRequest(w, http.StatusServiceUnavailable, fmt.Sprintf("%s %q: the store did not answer (the slot is freed when its lease ends)", what, lim.Name()))
		return nil, d, false
	}
	w.Header().Set("Cache-Control", "no-store")
	return lim, d, true
}

// release frees a concurrency slot that /v1/take acquired.
func (g *Gate) release(w http.ResponseWriter, r *http.Request) {
	lim, d, ok := g.leaseCall(w, r, "release", g.lim.Release)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, ReleaseResponse{
		Released: d.Allowed, Rule: lim.Name(),
		Limit: d.Capacity, Remaining: max(d.Remaining, 0), ResetAfterMs: ceilMillis(d.ResetAfter),
	})
}

// renew extends the lease of a concurrency slot that /v1/take acquired,
// for work that runs longer than the lease. It never acquires a slot: a
// lease id the caller sends is never one the server did not draw.
func (g *Gate) renew(w http.ResponseWriter, r *http.Request) {
	lim, d, ok := g.leaseCall(w, r, "renew", g.lim.Renew)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, RenewResponse{
		Renewed: d.Allowed, Rule: lim.Name(), LeaseMs: ceilMillis(lim.LeaseTerm()),
		Limit: d.Capacity, Remaining: max(d.Remaining, 0), ResetAfterMs: ceilMillis(d.ResetAfter),
	})
}
