package httpgate

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/settle"
)

// SettleRequest is the body of /v1/settle: it settles, once, the take
// whose /v1/take answer gave the handle (settle.Issue).
type SettleRequest struct {
	// Handle is the settle of a /v1/take answer.
	Handle string `json:"handle"`
	// Actual is what the request turned out to cost: a finite number >= 0.
	Actual *float64 `json:"actual"`
}

// SettleResponse is the answer of /v1/settle.
type SettleResponse struct {
	Rule string `json:"rule"`
	Key  string `json:"key"`
	// Charged is what the take charged; Actual what it cost.
	Charged float64 `json:"charged"`
	Actual  float64 `json:"actual"`
	// Refunded, Extra and Forgiven are sluice.Settlement's: tokens given
	// back, charged on top, and used beyond what the debt bound lets be
	// charged.
	Refunded float64 `json:"refunded"`
	Extra    float64 `json:"extra"`
	Forgiven float64 `json:"forgiven"`
	// Limit, Remaining, Tokens and ResetAfterMs describe the bucket after
	// the settlement, as a decision does; absent when the actual cost was
	// the charge, which changes nothing.
	Limit        *int64   `json:"limit,omitempty"`
	Remaining    *int64   `json:"remaining,omitempty"`
	Tokens       *float64 `json:"tokens,omitempty"`
	ResetAfterMs *int64   `json:"reset_after_ms,omitempty"`
}

// settleKey is the key handles are signed with: settle_secret_env's, else
// this process's own.
func (g *Gate) settleKey(p *policy.Policy) []byte {
	if env := p.Settings.SettleSecretEnv; env != "" {
		if k := g.opts.Getenv(env); k != "" {
			return []byte(k)
		}
	}
	return g.settle.key[:]
}

// settleAPI serves /v1/settle.
func (g *Gate) settleAPI(w http.ResponseWriter, r *http.Request) {
	var body SettleRequest
	if !decodeBody(w, r, &body) {
		return
	}
	switch {
	case body.Handle == "":
		badRequest(w, http.StatusBadRequest, `"handle" is required: the "settle" of a /v1/take answer`)
		return
	case body.Actual == nil:
		badRequest(w, http.StatusBadRequest, `"actual" is required: what the request cost, a number >= 0`)
		return
	case math.IsNaN(*body.Actual) || math.IsInf(*body.Actual, 0) || *body.Actual < 0:
		badRequest(w, http.StatusBadRequest, fmt.Sprintf(`"actual" must be a finite number >= 0, got %v`, *body.Actual))
		return
	}
	p := g.Policy()
	h, err := settle.Open(g.settleKey(p), body.Handle)
	switch {
	case errors.Is(err, settle.ErrForged):
		badRequest(w, http.StatusForbidden, "the handle was not issued by this server (or by one sharing its settle_secret_env key), or was altered")
		return
	case err != nil:
		badRequest(w, http.StatusBadRequest, `"handle" is malformed: pass the "settle" of a /v1/take answer as it is`)
		return
	case g.lim.Now().Unix() >= h.Expires:
		badRequest(w, http.StatusForbidden, fmt.Sprintf("the handle expired at %s: a take is settled within %v of it", time.Unix(h.Expires, 0).UTC().Format(time.RFC3339), g.opts.SettleTTL))
		return
	}
	rule, lim, err := p.FindLimit(h.Rule)
	if err != nil || rule.SettleFrom(lim) == nil {
		badRequest(w, http.StatusConflict, fmt.Sprintf("limit %q no longer settles (the policy changed since the take): the take stays charged as it was", h.Rule))
		return
	}
	ctx, cancel := deadline.WithTimeout(r.Context(), g.opts.StoreTimeout)
	defer cancel()
	spent, err := g.lim.Take(ctx, sluice.Request{Limit: g.settle.nonces, Key: hex.EncodeToString(h.Nonce[:])})
	if err != nil {
		g.storeLog.Log(g.opts.Logger, g.settle.nonces.Name(), h.Rule, err, true)
		badRequest(w, http.StatusServiceUnavailable, "the store did not answer (the error is in the server's log); the handle may be sent again")
		return
	}
	if !spent.Allowed {
		badRequest(w, http.StatusConflict, "the handle was settled already: each take is settled once")
		return
	}
	charged := engine.FromMicroTokens(h.Charged)
	s, err := g.settleOne(ctx, sluice.Request{Limit: lim, Key: h.Key, Cost: charged}, *body.Actual)
	if err != nil {
		badRequest(w, http.StatusServiceUnavailable, "the store did not answer (the error is in the server's log); the take stays charged as it was, and the handle is spent")
		return
	}
	out := SettleResponse{Rule: h.Rule, Key: h.Key, Charged: charged, Actual: *body.Actual, Refunded: s.Refunded, Extra: s.Extra, Forgiven: s.Forgiven}
	if s.Refunded != 0 || s.Extra != 0 || s.Forgiven != 0 {
		d := s.Decision
		rem, reset := max(d.Remaining, 0), ceilMillis(d.ResetAfter)
		out.Limit, out.Remaining, out.Tokens, out.ResetAfterMs = &d.Capacity, &rem, &d.Tokens, &reset
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}
