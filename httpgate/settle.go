package httpgate

// Charging what was used, in the reverse proxy and the middleware: the
// actual cost that package settle reads is settled here (Limiter.Settle).

import (
	"cmp"
	"context"
	"crypto/rand"
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/internal/defaults"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/settle"
)

// Defaults of the settlement options.
const (
	// DefaultSettleTTL is how long a settlement handle may be used.
	DefaultSettleTTL = time.Hour
	// DefaultBodyMemory bounds the request bodies, and the JSON response
	// bodies, held at once for body:PATH costs.
	DefaultBodyMemory = 64 << 20
)

// settleState is what a Gate keeps for settlements.
type settleState struct {
	// key signs the decision API's handles when the policy names no
	// settle_secret_env: random, so they are good in this process only.
	key [32]byte
	// bodyMemory bounds the request bodies held at once
	// (Options.BodyMemory, Options.BodyMemoryPerClient), and the JSON
	// response bodies held to read their cost. One bound for both, not a
	// second of its own: they are the memory that settlement holds for a
	// client, which an operator sizes once, and a client that fills its
	// share with one kind (large requests, or requests that make large
	// answers) is held to the same share as one mixing both; a second
	// bound would have the server hold twice what BodyMemory says.
	bodyMemory *settle.BodyMemory
	// nonces spends the decision API's handles (settle.NonceLimit).
	nonces *sluice.Limit
}

func (g *Gate) initSettle() {
	defaults.Set(&g.opts.SettleTTL, DefaultSettleTTL)
	defaults.Set(&g.opts.BodyMemory, DefaultBodyMemory)
	defaults.Set(&g.opts.BodyMemoryPerClient, max(g.opts.BodyMemory/4, 1))
	g.settle.bodyMemory = settle.NewBodyMemory(g.opts.BodyMemory, g.opts.BodyMemoryPerClient)
	g.settle.nonces = settle.NonceLimit(g.opts.SettleTTL)
	rand.Read(g.settle.key[:]) // crypto/rand.Read never fails (Go 1.24+)
}

// prepareSettle readies r for p's settlements before it is decided: it
// drops from r the headers and trailers that settle_from reads from
// responses (a client must not state its own cost to an upstream that
// echoes them), and reads the body into in.Body when a cost_source reads
// it. The function it returns gives the body's memory back; call it once
// the request is done.
func (g *Gate) prepareSettle(r *http.Request, p *policy.Policy, in *policy.Input) func() {
	for _, h := range p.SettleHeaders() {
		r.Header.Del(h)
		r.Trailer.Del(h)
	}
	if !p.ReadsBody() {
		return func() {}
	}
	body, release := settle.ReadBody(r, policy.CostBodyLimit, g.settle.bodyMemory, bodyClient(p, in))
	in.Body = body
	return release
}

// bodyClient is who holds a request's body, and its response's, in
// memory: its client address
// as the policy resolves it (through trusted_proxies), IPv6 by the
// policy's prefix, as ip:address keys it; "" when there is none to tell
// clients apart by (a Unix socket), bounded by BodyMemory alone.
func bodyClient(p *policy.Policy, in *policy.Input) string {
	if !in.ClientIP.IsValid() {
		return ""
	}
	return policy.AddressKey(in.ClientIP, p.Settings.IPv6Prefix)
}

// serveSettled serves r with next and then settles the limits of v that
// settle from the response (settle.Serve), each with the actual cost the
// response states, or, when it states none that can be used, with the
// rule's unsettled_cost (never less than the estimate). in is r as p
// read it, with its body as read for its cost (nil when not read); a JSON
// response is held for its cost in the gate's body memory, for in's
// client (bodyClient), worked out only for a response that settles.
func (g *Gate) serveSettled(next http.Handler, w http.ResponseWriter, r *http.Request, v *policy.Verdict, p *policy.Policy, in *policy.Input) {
	// The limits that charged the request (admitted, the store answered)
	// and whose settle_from a response states.
	var rs []*policy.Result
	var sources []*settle.Source
	for i := range v.Results {
		res := &v.Results[i]
		if s := res.Match.Settle; v.Allowed && s != nil && s.Kind != settle.Caller && res.Decision.Allowed && res.StoreErr == nil {
			rs, sources = append(rs, res), append(sources, s)
		}
	}
	if len(rs) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	settle.Serve(next, w, r, sources, in.Body, g.settle.bodyMemory, bodyClient(p, in), func(rec *settle.Recorder) { g.settleAll(r, rs, rec) })
}

// settleAll settles each of rs at what rec read of the response.
func (g *Gate) settleAll(r *http.Request, rs []*policy.Result, rec *settle.Recorder) {
	ctx, cancel := deadline.WithTimeout(context.WithoutCancel(r.Context()), g.opts.StoreTimeout)
	defer cancel()
	for i, res := range rs {
		// An adaptive rate charges in scaled units (policy.Match.Scale):
		// the actual cost is scaled alike.
		scale := res.Match.Scale()
		actual, why := rec.Actual(i)
		if why == "" {
			g.settleOne(ctx, res.Match.Request, actual*scale)
			continue
		}
		charge := max(res.Match.Settle.UnsettledCost(res.Match.Request.Cost, scale), actual*scale)
		g.opts.Logger.Debug("unsettled", "limit", res.Match.Request.Limit.Name(), "key", res.Match.Request.Key, "why", why, "charge", charge)
		g.settleOne(ctx, res.Match.Request, charge)
	}
}

// settleOne settles req, charged req.Cost, at actual, logging what was
// done (and a store's failure, which leaves the estimate charged).
func (g *Gate) settleOne(ctx context.Context, req sluice.Request, actual float64) (sluice.Settlement, error) {
	charged := cmp.Or(req.Cost, 1)
	s, err := g.lim.Settle(ctx, req, charged, actual)
	if err != nil {
		g.storeLog.Log(g.opts.Logger, req.Limit.Name(), req.Key, err, false)
		return s, err
	}
	g.opts.Logger.Debug("settled", "limit", req.Limit.Name(), "key", req.Key, "charged", charged, "actual", actual,
		"refunded", s.Refunded, "extra", s.Extra, "forgiven", s.Forgiven)
	return s, nil
}
