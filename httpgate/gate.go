package httpgate

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/internal/defaults"
	"github.com/sluicehq/sluice/policy"
)

// Options configures a Gate. The zero value works: no metrics, no audit
// log, the default slog logger.
type Options struct {
	// Ready, when set, is asked by /readyz after the store answered: an
	// error fails it with that reason (a policy source that has not
	// delivered a policy yet, such as an xDS control plane).
	Ready func() error
	// Healthy, when set, is asked by /healthcheck, the reference rate
	// limit service's health check (Envoy Gateway probes it): an error
	// fails it with that reason.
	Healthy func() error
	// Metrics counts decisions and serves /metrics; nil counts nothing.
	// A *metrics.Metrics is one (wrap the limiter's store with its
	// InstrumentStore to time store calls).
	Metrics Metrics
	// Audit records every rejection; nil records none.
	Audit *Audit
	// Logger receives operational logs (default slog.Default()).
	Logger *slog.Logger
	// StoreTimeout is the deadline of one decision's store calls (default
	// 2s). A store that does not answer in time is a store error, handled
	// by each rule's on_store_error.
	StoreTimeout time.Duration
	// Getenv reads the admin token's environment variable (default
	// os.Getenv); the token is read on every /v1/reset, so rotating it
	// needs no restart.
	Getenv func(string) string
	// Delay holds an admitted request until its reserved turn (leaky
	// buckets, reserve: true), or fails when ctx ends first. The default
	// waits on a timer; tests pass one that records the wait.
	Delay func(ctx context.Context, d time.Duration) error
	// Insight, when set, is told every decision and serves the live page
	// (GET /ui) and its data (GET /v1/stats) behind the admin token; nil
	// serves neither.
	Insight *insight.Collector

	// SettleTTL is how long a settlement handle of /v1/take may be used
	// (default DefaultSettleTTL).
	SettleTTL time.Duration
	// BodyMemory bounds the bytes of request bodies, and of JSON response
	// bodies, held at once for body:PATH costs, over every request
	// (default DefaultBodyMemory). A request that finds it spent is
	// charged its rule's default_cost, its body streamed on unread; a
	// response that does not fit is passed on whole, unread, and its
	// request charged the rule's unsettled_cost.
	BodyMemory int64
	// BodyMemoryPerClient bounds the bytes of BodyMemory that the bodies
	// of one client (its address as ip:address keys it: through
	// trusted_proxies, an IPv6 one by its ipv6_prefix) hold at once
	// (default a quarter of BodyMemory), so that one client holding
	// bodies, declared large and sent slowly (or responses, large and
	// read slowly), cannot leave every other client's unread and charged
	// default_cost or unsettled_cost. A body beyond its client's share is
	// treated as one beyond BodyMemory. Requests with no
	// client address (a Unix socket) are bounded by BodyMemory alone.
	BodyMemoryPerClient int64
}

// Metrics is what a Gate asks of its metrics: to count each decision and
// to serve them. Package metrics implements it with Prometheus; an
// interface, so that a program using the middleware alone does not link
// Prometheus (a third of a small program's binary).
type Metrics interface {
	policy.Observer
	// Handler serves the metrics (GET /metrics on the decision API).
	Handler() http.Handler
}

// ShapingMetrics is what a Metrics also counts when its rules shape
// traffic: adaptive rates and held requests. A *metrics.Metrics does;
// a Metrics that does not leaves them uncounted.
type ShapingMetrics interface {
	// AdaptiveRate is the rate in force and its floor (the limit's min).
	AdaptiveRate(rule string, perSecond, minPerSecond float64)
	Queued(rule string, n int64)
	QueueDelay(rule string, d time.Duration)
}

// noShaping counts nothing.
type noShaping struct{}

func (noShaping) AdaptiveRate(string, float64, float64) {}
func (noShaping) Queued(string, int64)                  {}
func (noShaping) QueueDelay(string, time.Duration)      {}

// shapingMetrics is where adaptive rates and queues are counted.
func (g *Gate) shapingMetrics() ShapingMetrics {
	if m, ok := g.opts.Metrics.(ShapingMetrics); ok {
		return m
	}
	return noShaping{}
}

// Wait is the default Options.Delay: it returns after d, or with ctx's
// error when ctx ends first.
func Wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Gate decides HTTP requests against a policy that can be replaced while
// it serves (hot reload). It is safe for concurrent use.
type Gate struct {
	pol      atomic.Pointer[policy.Policy]
	lim      *sluice.Limiter
	opts     Options
	draining atomic.Bool
	storeLog policy.StoreErrorLog
	obs      policy.Observer // Metrics and Insight, nil for neither
	ui       *uiSecrets      // nil without Insight
	fleet    fleetState      // this process in its fleet (fleet.go)
	settle   settleState
	shaping  shaping  // adaptive rates and queues (adaptive.go, queue.go)
	guess    *guesses // token guesses per address (guess.go)
	// layered marks a simple middleware's gate (stacked), whose admitted
	// requests note until when their charge may be given back.
	layered bool
}

// New returns a Gate enforcing p with lim.
func New(p *policy.Policy, lim *sluice.Limiter, opts Options) *Gate {
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	defaults.Set(&opts.StoreTimeout, 2*time.Second)
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	if opts.Delay == nil {
		opts.Delay = Wait
	}
	g := &Gate{lim: lim, opts: opts}
	g.guess = newGuesses(limiterClock(lim))
	var obs []policy.Observer
	if opts.Metrics != nil {
		obs = append(obs, opts.Metrics)
	}
	if opts.Insight != nil {
		obs = append(obs, opts.Insight)
		g.ui = newUISecrets()
		g.fleet.id, g.fleet.host = newProcessID()
	}
	g.obs = policy.Observers(obs...)
	g.initSettle()
	g.initShaping()
	g.SetPolicy(p)
	return g
}

// limiterClock is lim as the clock of the gate's own buckets, nil (the
// system's) without one.
func limiterClock(lim *sluice.Limiter) sluice.Clock {
	if lim == nil {
		return nil
	}
	return lim
}

// Observer is what the gate tells every decision: Options.Metrics and
// Options.Insight (nil when neither is set), for the other transports of
// the same process (the Envoy service) to tell theirs.
func (g *Gate) Observer() policy.Observer { return g.obs }

// Policy returns the policy in force.
func (g *Gate) Policy() *policy.Policy { return g.pol.Load() }

// SetPolicy replaces the policy atomically: requests already deciding
// finish with the old one, later ones use p. Bucket state lives in the
// store under each limit's name, so rules that keep their name (and
// algorithm) keep their state.
func (g *Gate) SetPolicy(p *policy.Policy) {
	g.pol.Store(p)
	if g.opts.Insight != nil {
		g.opts.Insight.PolicyInForce()
	}
}

// Drain makes /readyz fail, so that load balancers stop sending traffic
// before a graceful shutdown.
func (g *Gate) Drain() { g.draining.Store(true) }

// Limiter returns the gate's limiter.
func (g *Gate) Limiter() *sluice.Limiter { return g.lim }

// Middleware wraps handlers with p's rules: every request is decided by
// policy.Policy.Enforce with the same headers and rejections as sluice
// serve's proxy and forward auth, and only admitted requests reach next.
// A rejected request gets a 429 with Retry-After, the RateLimit fields and
// an application/problem+json body.
func Middleware(p *policy.Policy, lim *sluice.Limiter, opts Options) func(http.Handler) http.Handler {
	return New(p, lim, opts).Wrap
}

// Wrap limits requests to next with the gate's current policy. A request
// that a concurrency rule admits holds its slot until next returns,
// however it returns (a panic, a client that went away, an upstream
// error), renewing the slot's lease while it runs. Limits that settle
// (settle_from) are settled once next has answered, from what its
// response says the request cost; adaptive rates measure the response.
func (g *Gate) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := g.Policy()
		in := p.FromHTTP(r)
		defer g.prepareSettle(r, p, in)()
		v, done, ok := g.enforceHeld(w, r, p, in, http.StatusTooManyRequests, http.StatusUnprocessableEntity, true, nil)
		if !ok {
			return
		}
		defer done()
		if g.layered {
			noteRefundable(r, &v, g.lim.Now())
		}
		settled := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.serveSettled(next, w, r, &v, p, in) })
		g.serveMeasured(settled, w, r, &v)
	})
}

// Check decides in against the current policy (charging the tokens) and
// returns the verdict with the response fields to send, counting it in the
// metrics and writing rejections to the audit log. It cannot know when
// the request ends, so a concurrency rule refuses what it matches
// (policy.Enforce); Wrap holds such rules' slots.
func (g *Gate) Check(ctx context.Context, in *policy.Input) (policy.Verdict, http.Header, error) {
	p := g.Policy()
	v, err := g.check(ctx, p, in, false)
	if err != nil {
		return v, nil, err
	}
	return v, RateLimitHeaders(v, v.Identity(), in.Path, p.Settings.Headers), nil
}

// check decides in with p. With hold, a concurrency rule's slot is
// acquired and held (policy.Options.Hold); the caller releases it.
func (g *Gate) check(ctx context.Context, p *policy.Policy, in *policy.Input, hold bool) (policy.Verdict, error) {
	v, q, err := g.checkHeld(ctx, p, in, hold, nil)
	q.release()
	return v, err
}

// checkHeld is check for a request that will be held until its turn:
// the places it took in its limits' queues are kept until release. The
// matches and the verdict are kept in s, when it is not nil.
func (g *Gate) checkHeld(ctx context.Context, p *policy.Policy, in *policy.Input, hold bool, s *policy.Scratch) (policy.Verdict, *queued, error) {
	var ms []policy.Match
	var err error
	if s != nil {
		ms, err = s.Match(p, in)
	} else {
		ms, err = p.Match(in)
	}
	if err != nil {
		return policy.Verdict{}, nil, fmt.Errorf("match %s %s: %w", in.Method, in.Path, err)
	}
	ctx, cancel := deadline.ForStore(withCaller(ctx, ms, in.ClientIP, in.Path), g.lim.Store(), g.opts.StoreTimeout)
	defer cancel()
	g.adapt(ctx, ms)
	q := g.enqueue(ms)
	v := policy.Enforce(ctx, g.lim, ms, policy.Options{Hold: hold, Scratch: s, Observer: g.obs})
	q.decided(&v)
	g.record(ctx, &v, in.ClientIP, in.Path)
	return v, q, nil
}

// withCaller tells the store whom the request is for (see sluice.Caller):
// the verified JWT subject when a match has one, the client and the path.
func withCaller(ctx context.Context, ms []policy.Match, clientIP netip.Addr, path string) context.Context {
	c := sluice.Caller{IP: clientIP, Endpoint: path}
	for _, m := range ms {
		if sub, ok := strings.CutPrefix(m.Identity, "sub:"); ok {
			c.User = sub
			break
		}
	}
	return sluice.WithCaller(ctx, c)
}

// enforce decides in, sets the rate limit fields on w and, on rejection,
// writes the deny status and a problem body; neverStatus is the status of
// a rejection no wait would end (a cost above a limit's burst: see
// policy.Verdict.Impossible). It reports whether the request may proceed.
func (g *Gate) enforce(w http.ResponseWriter, r *http.Request, p *policy.Policy, in *policy.Input, denyStatus, neverStatus int, s *policy.Scratch) bool {
	_, _, ok := g.enforceHeld(w, r, p, in, denyStatus, neverStatus, false, s)
	return ok
}

// enforceHeld is enforce, with concurrency slots held when hold is set:
// an admitted verdict's leases are then kept (holdSlots) until the
// caller calls done. A request that does not go ahead holds none. s,
// when not nil, keeps the matches and the verdict (see checkHeld).
func (g *Gate) enforceHeld(w http.ResponseWriter, r *http.Request, p *policy.Policy, in *policy.Input, denyStatus, neverStatus int, hold bool, s *policy.Scratch) (v policy.Verdict, done func(), ok bool) {
	v, q, err := g.checkHeld(r.Context(), p, in, hold, s)
	defer q.release()
	if err != nil {
		badRequest(w, http.StatusBadRequest, err.Error())
		return v, nil, false
	}
	setRateLimitHeaders(w.Header(), &v, v.Identity(), in.Path, p.Settings.Headers)
	if !v.Allowed {
		if v.Reason() == policy.ReasonConcurrencyUnsupported {
			writeUnsupported(w, v)
			return v, nil, false
		}
		if detail, names, never := v.Impossible(); never {
			writeImpossible(w, detail, names, neverStatus)
			return v, nil, false
		}
		WriteRejection(w, v, denyStatus)
		return v, nil, false
	}
	// Kept from the decision, not from the turn: a turn may come after an
	// unrenewed lease ended, and another request took its slot.
	done = g.holdSlots(r, &v)
	// An admitted reservation (a leaky bucket shaping traffic) goes ahead
	// when its turn comes: holding it here is what spaces the requests.
	if d := v.Overall.RetryAfter; d > 0 {
		if err := g.opts.Delay(withHeld(r.Context(), w), d); err != nil {
			done()
			g.giveBack(r, &v)
			return v, nil, false // the client gave up; nobody to answer
		}
	}
	return v, done, true
}

// giveBack refunds what v charged for a request whose client went away
// before its turn: the request is never served, so its turn must not stay
// owed by the bucket's other requests. What it took of a window without
// a turn there stays taken, as a served request's: a refund counts in the
// window of its moment, a later one by now. The client's context is done,
// so the refund runs on one of its own, bounded by the store timeout.
func (g *Gate) giveBack(r *http.Request, v *policy.Verdict) {
	ms := make([]policy.Match, 0, len(v.Results))
	for i := range v.Results {
		// A limit that was not charged (a store failure admitted, a
		// shadow rule that would have refused) has nothing to give back.
		res := &v.Results[i]
		alg := res.Match.Request.Limit.Algorithm()
		if res.StoreErr == nil && res.Decision.Allowed && (alg == sluice.TokenBucket || alg == sluice.LeakyBucket || res.Decision.RetryAfter > 0) {
			ms = append(ms, res.Match)
		}
	}
	if len(ms) == 0 {
		return
	}
	ctx, cancel := deadline.WithTimeout(context.WithoutCancel(r.Context()), g.opts.StoreTimeout)
	defer cancel()
	back := policy.Enforce(ctx, g.lim, ms, policy.Options{Op: engine.OpRefund})
	for i := range back.Results {
		if err := back.Results[i].StoreErr; err != nil {
			g.storeLog.Log(g.opts.Logger, back.Results[i].Match.Request.Limit.Name(), back.Results[i].Match.Request.Key, fmt.Errorf("giving back the turn of a client that left (its bucket pays it back at its rate instead): %w", err), false)
		}
	}
}

// writeImpossible answers a request whose cost a limit can never grant:
// a problem naming the limits and why, with no Retry-After (no wait helps).
func writeImpossible(w http.ResponseWriter, detail string, names []string, status int) {
	w.Header().Del("Retry-After")
	writeProblem(w, Problem{
		Status:           status,
		Detail:           detail + ": lower the request's cost (or ask the operator for a larger burst)",
		ViolatedPolicies: names,
		Reason:           policy.ReasonCostExceedsLimit,
	})
}

// WriteRejection writes the status and application/problem+json body of a
// rejection (type quota-exceeded, naming the violated limits) whose
// fields, from RateLimitHeaders, are already set on w.
func WriteRejection(w http.ResponseWriter, v policy.Verdict, status int) {
	status = cmp.Or(status, http.StatusTooManyRequests)
	ra, _ := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
	detail, names := v.Violations()
	writeProblem(w, Problem{
		Type:             QuotaExceededType,
		Title:            "Too Many Requests",
		Status:           status,
		Detail:           detail,
		ViolatedPolicies: names,
		Reason:           v.Reason(),
		RetryAfter:       ra,
	})
}

// record writes v's rejections (shadow ones too) to the audit log and logs
// store failures.
func (g *Gate) record(ctx context.Context, v *policy.Verdict, clientIP netip.Addr, path string) {
	for i := range v.Results {
		r := &v.Results[i]
		lim := r.Match.Request.Limit
		if r.StoreErr != nil {
			g.storeLog.Log(g.opts.Logger, lim.Name(), r.Match.Request.Key, r.StoreErr, !r.Decision.Allowed)
		}
		if !r.Refused() {
			continue
		}
		if g.opts.Audit == nil {
			continue
		}
		ip := ""
		if clientIP.IsValid() {
			ip = clientIP.String()
		}
		g.opts.Audit.Write(ctx, Record{
			Rule:     lim.Name(),
			Key:      r.Match.Request.Key,
			ClientIP: ip,
			Path:     path,
			Tokens:   r.Decision.Tokens,
			Shadow:   r.Shadow,
			Reason:   r.Reason(),
		})
	}
}
