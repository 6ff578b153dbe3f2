package httpgate

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// The common limits in one line, without a configuration file:
//
//	http.ListenAndServe(":8080", httpgate.LimitByIP(100, time.Minute)(app))
//
// Each builds a policy in code (policy.FromRules) and serves it with
// Middleware, so its answers are the configured middleware's: the same
// RateLimit fields, 429, Retry-After and problem+json body. Stacked, they
// are all or nothing, as one policy's rules are: when an inner one
// rejects a request, the outer ones give back the token they charged it
// (a refund, so for the moment between the two the outer bucket holds
// it). A refund counts at the moment it lands, so a fixed window gives
// a charge back only while the window it counted in lasts, and a
// sliding log never (it would take out its newest entry, not the
// request's): a middleware between two layers that holds a request
// across a window's end (reading a slow body) would otherwise hand the
// next window the charge again. Other middlewares between them do not
// change the rest; a Middleware built from a policy file does not take
// part (put its limits in one policy, which is all or nothing by itself).

// LimitOption changes a limit that LimitByIP, LimitByHeader or
// LimitGlobal builds.
type LimitOption func(*limitConfig)

type limitConfig struct {
	lim          *sluice.Limiter
	trusted      []netip.Prefix
	clientHeader string
	name         string
	alg          sluice.Algorithm
	opts         Options
}

// WithLimiter keeps the buckets in lim's store (sluice.New(redisStore) for
// a fleet). The default is an in-memory store of its own per middleware.
func WithLimiter(lim *sluice.Limiter) LimitOption { return func(c *limitConfig) { c.lim = lim } }

// WithTrustedProxies names the proxies in front whose X-Forwarded-For is
// believed when LimitByIP finds the client address: a
// request from one of them is counted against the first address in the
// header, read from the right, that is not one of them. Without it (the
// default) the address is the connection's peer and every forwarding
// header is ignored, so that no client picks its own bucket by sending
// one; behind a proxy, all traffic then shares the proxy's bucket until
// the proxy is named here.
func WithTrustedProxies(prefixes ...netip.Prefix) LimitOption {
	return func(c *limitConfig) { c.trusted = append(c.trusted, prefixes...) }
}

// WithClientHeader names the one header in which the trusted proxies
// (WithTrustedProxies) write the client's address: "X-Forwarded-For" by
// default, "Forwarded" (its for= parameters) or another comma-separated
// list such as "X-Real-IP". No other header is read: a proxy passes on
// the forwarding headers it does not write, so behind one that writes
// Forwarded, X-Forwarded-For is the client's to fill. A name that is
// not a header name panics at start-up.
func WithClientHeader(name string) LimitOption {
	return func(c *limitConfig) { c.clientHeader = name }
}

// WithName names the limit in the RateLimit fields, the 429 body and the
// store's keys. The default says what it counts, how many and per what
// ("ip-100-per-1m", "header-x-api-key-10-per-1s", "global-5000-per-1h"),
// so that limits sharing a store (WithLimiter) never share buckets; two
// limits given one name would.
func WithName(name string) LimitOption { return func(c *limitConfig) { c.name = name } }

// WithAlgorithm counts with a (sluice.TokenBucket by default; also
// sluice.FixedWindow or sluice.SlidingLog).
func WithAlgorithm(a sluice.Algorithm) LimitOption { return func(c *limitConfig) { c.alg = a } }

// WithOptions gives the middleware's Options: metrics, audit log, logger,
// store timeout.
func WithOptions(o Options) LimitOption { return func(c *limitConfig) { c.opts = o } }

// LimitByIP admits n requests per period from each client address and
// answers the rest with a 429: go-chi/httprate's LimitByIP, with
// sluice's answers. The address is the connection's peer unless the
// peer is a trusted proxy (WithTrustedProxies); IPv6 clients are
// counted by /64, as a file's ip:address is.
//
// The default algorithm is a token bucket of n refilling n per period: n
// requests may pass at once, then one every period/n, so no period
// admits more than 2n and any long run averages n per period. Choose
// sluice.SlidingLog (WithAlgorithm) for never more than n in any period,
// at the cost of n timestamps per client, or sluice.FixedWindow for n per
// window with windows spread by client.
//
// It panics when n or per is not positive or an option is invalid: the
// arguments are written in code, as sluice.MustLimit's are.
func LimitByIP(n int, per time.Duration, opts ...LimitOption) func(http.Handler) http.Handler {
	return limitBy("ip", "ip:address", n, per, opts)
}

// LimitByHeader admits n requests per period for each value of the
// header called name (an API key, a tenant); requests without it share
// one bucket. The value is whatever the client sends: a client that
// sends a fresh value with each request gets a fresh bucket each time.
// Key by a header only when something checks it (the handler verifies
// the API key, or the proxy in front sets the header on every request),
// and put LimitByIP in front of it for the clients that forge one. See
// LimitByIP for the algorithm and for when it panics.
func LimitByHeader(name string, n int, per time.Duration, opts ...LimitOption) func(http.Handler) http.Handler {
	return limitBy("header-"+strings.ToLower(name), "header:"+name, n, per, opts)
}

// LimitGlobal admits n requests per period in all, whoever sends them:
// one bucket. See LimitByIP for the algorithm and for when it panics.
func LimitGlobal(n int, per time.Duration, opts ...LimitOption) func(http.Handler) http.Handler {
	return limitBy("global", "", n, per, opts)
}

// limitBy builds the middleware of n per period keyed by key ("" for one
// bucket); what names it in the default limit name.
func limitBy(what, key string, n int, per time.Duration, opts []LimitOption) func(http.Handler) http.Handler {
	if n <= 0 || per <= 0 {
		panic(fmt.Sprintf("httpgate: a limit of %d per %v admits nothing: give n > 0 and a period > 0", n, per))
	}
	c := limitConfig{alg: sluice.TokenBucket}
	for _, o := range opts {
		o(&c)
	}
	c.name = cmp.Or(c.name, fmt.Sprintf("%s-%d-per-%s", nameSafe(what), n, shortDuration(per)))
	if c.alg != sluice.TokenBucket && c.alg != sluice.FixedWindow && c.alg != sluice.SlidingLog {
		panic(fmt.Sprintf("httpgate: %s does not count n per period (want a token bucket, fixed window or sliding log)", c.alg))
	}
	lim, err := sluice.NewLimit(sluice.Spec{Name: c.name, Algorithm: c.alg, Rate: float64(n), Period: per, Capacity: float64(n)})
	if err != nil {
		panic("httpgate: " + err.Error())
	}
	rule := policy.CodeRule{Limit: lim}
	if key != "" {
		rule.LimitKeys = []string{key}
	}
	s := policy.DefaultSettings()
	s.TrustedProxies = c.trusted
	s.ClientHeader = cmp.Or(c.clientHeader, s.ClientHeader)
	p, err := policy.FromRules(s, rule)
	if err != nil {
		panic("httpgate: " + err.Error())
	}
	if c.lim == nil {
		c.lim = sluice.New(memory.New(memory.Options{}))
	}
	g := New(p, c.lim, c.opts)
	g.layered = true
	return stacked(g)
}

// A request through stacked simple middlewares (LimitByIP(...)(
// LimitByHeader(...)(app))) is all or nothing: when one of them does not
// pass it on (it rejects it, or the client leaves while it waits its
// turn), the ones above it, which had charged it, refund their charge. A
// layer finds the one above in the request's context.

// layerKey is the context key of the innermost simple middleware that
// admitted the request.
type layerKey struct{}

// layer is one simple middleware's part in one request. Atomic: a
// handler between two layers (http.TimeoutHandler) may run the inner one
// on another goroutine.
type layer struct {
	passed  atomic.Bool // it passed the request on: it charged
	refused atomic.Bool // a simple middleware below it did not pass it on
	// refundBy is until when (Unix nanoseconds on the limiter's clock)
	// its charge may be given back (noteRefundable).
	refundBy atomic.Int64
}

// noteRefundable notes in r's layer until when the charge of v, admitted
// at now, may be given back: a bucket's at any time, since a refund
// restores what it took whenever it lands; a fixed window's until the
// window it counted in ends (ResetAfter: a simple limit's capacity is one
// window's), since a refund after that counts in the next window and
// gives it the charge again (TestAttackStackedRefundCarriesIntoNextWindow);
// a sliding log's never, since a refund takes out the log's newest entry,
// which by then may be a later request's, and frees room early.
func noteRefundable(r *http.Request, v *policy.Verdict, now time.Time) {
	me, _ := r.Context().Value(layerKey{}).(*layer)
	if me == nil {
		return
	}
	by := int64(math.MaxInt64)
	for i := range v.Results {
		res := &v.Results[i]
		switch res.Match.Request.Limit.Algorithm() {
		case sluice.TokenBucket, sluice.LeakyBucket:
		case sluice.FixedWindow:
			by = min(by, now.Add(res.Decision.ResetAfter).UnixNano())
		default:
			by = math.MinInt64
		}
	}
	me.refundBy.Store(by)
}

// stacked is g.Wrap, all or nothing with the simple middlewares around it.
func stacked(g *Gate) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		admitted := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			me, _ := r.Context().Value(layerKey{}).(*layer)
			if me == nil { // unreachable: the context is the one given below
				next.ServeHTTP(w, r)
				return
			}
			me.passed.Store(true)
			next.ServeHTTP(w, r)
			if me.refused.Load() && g.lim.Now().UnixNano() < me.refundBy.Load() {
				g.refund(r)
			}
		}))
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			above, _ := r.Context().Value(layerKey{}).(*layer)
			me := &layer{}
			admitted.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), layerKey{}, me)))
			// Not passed on here, or refused below: not served, so every
			// layer above gives its charge back too.
			if above != nil && (!me.passed.Load() || me.refused.Load()) {
				above.refused.Store(true)
			}
		})
	}
}

// refund gives back what the gate's policy charged r: a simple
// middleware's rule costs one token and reads no body, so matching r
// again finds what was charged. It outlives the client, which may have
// gone: the charge is the other requests' to use.
func (g *Gate) refund(r *http.Request) {
	p := g.Policy()
	ms, err := p.Match(p.FromHTTP(r))
	if err != nil || len(ms) == 0 {
		return
	}
	ctx, cancel := deadline.ForStore(context.WithoutCancel(r.Context()), g.lim.Store(), g.opts.StoreTimeout)
	defer cancel()
	v := policy.Enforce(ctx, g.lim, ms, policy.Options{Op: engine.OpRefund})
	for i := range v.Results {
		if rr := &v.Results[i]; rr.StoreErr != nil {
			g.storeLog.Log(g.opts.Logger, rr.Match.Request.Limit.Name(), rr.Match.Request.Key, rr.StoreErr, false)
		}
	}
}

// nameSafe keeps what a limit name may hold (A-Z a-z 0-9 _ . -) and
// makes the rest '_', within 40 bytes, leaving room for the count and
// the period.
func nameSafe(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			b[i] = '_'
		}
	}
	b = b[:min(len(b), 40)]
	return string(b)
}

// shortDuration writes d in its largest whole unit ("1m", "90s",
// "250ms", "1500us"), as a limit name may hold it.
func shortDuration(d time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "us"}} {
		if d%u.d == 0 {
			return fmt.Sprintf("%d%s", d/u.d, u.name)
		}
	}
	return fmt.Sprintf("%dns", d)
}
