package httpgate

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/policy"
)

// shaping is what a Gate keeps about the upstream it stands in front of:
// each adaptive limit's controller and each limit's queue of held
// requests, by limit name, so that both outlive a reload that keeps the
// name (as bucket state does).
type shaping struct {
	mu          sync.Mutex
	controllers map[string]*adaptive.Controller
	queues      map[string]*ruleQueue
}

// AdaptiveRate is the state of one adaptive limit (Gate.AdaptiveRates).
type AdaptiveRate struct {
	// Rule names the limit: a rule's name, or RULE.TIER.
	Rule string `json:"rule"`
	// Rate is the rate in force, Start the one the limit was written
	// with, Min and Max its bounds: tokens per Per.
	Rate  float64 `json:"rate"`
	Start float64 `json:"start"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
	// Per is the period of the rates (one second for tokens_per_second).
	Per time.Duration `json:"per_ns"`
}

// AdaptiveRates reports the rate in force of every adaptive limit of the
// current policy, in file order; a limit no request has reached yet is
// at its Start.
func (g *Gate) AdaptiveRates() []AdaptiveRate {
	var out []AdaptiveRate
	for _, al := range g.Policy().AdaptiveLimits() {
		c := al.Config
		r := AdaptiveRate{Rule: al.Name, Rate: c.Start, Start: c.Start, Min: c.Min, Max: c.Max, Per: c.Per}
		g.shaping.mu.Lock()
		ctl := g.shaping.controllers[al.Name]
		g.shaping.mu.Unlock()
		if ctl != nil {
			ctl.SetConfig(c) // a reload's bounds apply before its first request
			r.Rate = ctl.Rate()
		}
		out = append(out, r)
	}
	return out
}

// adapt charges the adaptive matches of ms at their limits' current
// rates, first taking an interval's step where one is due.
func (g *Gate) adapt(ctx context.Context, ms []policy.Match) {
	for i := range ms {
		cfg := ms[i].Adaptive()
		if cfg == nil {
			continue
		}
		now := g.lim.Now()
		ctl := g.controller(ctx, ms[i].Request.Limit.Name(), cfg, now)
		g.tick(ctx, ctl, now)
		ms[i].AtScale(ctl.Scale())
	}
}

// controller returns the controller of the adaptive limit name, made on
// first use: it keeps its rate in the store when the store shares values
// (Redis), so that a fleet moves one rate, else in this process.
func (g *Gate) controller(ctx context.Context, name string, cfg *adaptive.Config, now time.Time) *adaptive.Controller {
	g.shaping.mu.Lock()
	ctl := g.shaping.controllers[name]
	if ctl != nil {
		g.shaping.mu.Unlock()
		ctl.SetConfig(cfg)
		return ctl
	}
	if g.shaping.controllers == nil {
		g.shaping.controllers = map[string]*adaptive.Controller{}
	}
	ctl = adaptive.NewController(name, cfg, sharedValues(g.lim.Store()), now)
	ctl.OnChange = func(rate float64) {
		c := ctl.Config()
		g.shapingMetrics().AdaptiveRate(name, rate/c.Per.Seconds(), c.Min/c.Per.Seconds())
	}
	g.shaping.controllers[name] = ctl
	g.shaping.mu.Unlock()
	g.shapingMetrics().AdaptiveRate(name, ctl.Rate()/cfg.Per.Seconds(), cfg.Min/cfg.Per.Seconds())
	if err := ctl.Sync(ctx, now); err != nil {
		g.opts.Logger.Warn("adaptive rate: starting from this process's own", "limit", name, "err", err)
	}
	return ctl
}

// tick takes ctl's step when its interval is over, logging a shared
// store's failure (the step is then taken on this process's state).
func (g *Gate) tick(ctx context.Context, ctl *adaptive.Controller, now time.Time) {
	if err := ctl.Tick(ctx, now); err != nil {
		g.opts.Logger.Warn("adaptive rate: stepped on this process's own state", "limit", ctl.Name(), "err", err)
	}
}

// sharedValues finds, beneath any wrappers (metrics' InstrumentStore),
// a store that shares values across a fleet; nil when there is none (the
// memory store: each process is the whole of its fleet).
func sharedValues(s sluice.Store) adaptive.Values {
	v, _ := beneath[adaptive.Values](s)
	return v
}

// wrapper is a store that wraps another (the metrics package's
// instrumented store), which Unwrap returns.
type wrapper interface {
	Unwrap() sluice.Store
}

// beneath finds, beneath any wrappers of s, a store that is a T.
func beneath[T any](s sluice.Store) (T, bool) {
	for range 8 {
		if v, ok := s.(T); ok {
			return v, true
		}
		u, ok := s.(wrapper)
		if !ok {
			break
		}
		s = u.Unwrap()
	}
	var zero T
	return zero, false
}

// serveMeasured serves an admitted request with next and, when v has
// adaptive limits, tells their controllers how the upstream answered to
// the client's key: the status, and the latency from when the request
// was fully sent (the transport's WroteRequest, or the wrapped handler's
// read of the body's end) to the first byte of the answer (the
// transport's GotFirstResponseByte, or the response's headers, which
// also follow an interim 1xx answer). So a client trickling its body, or
// drawing a 100 Continue with its Expect header, is not a slow (or fast)
// upstream, and an event stream's length says nothing of the upstream's
// health.
func (g *Gate) serveMeasured(next http.Handler, w http.ResponseWriter, r *http.Request, v *policy.Verdict) {
	type measured struct {
		ctl *adaptive.Controller
		key string
	}
	var ms []measured
	for i := range v.Results {
		m := &v.Results[i].Match
		if m.Adaptive() == nil {
			continue
		}
		g.shaping.mu.Lock()
		if ctl := g.shaping.controllers[m.Request.Limit.Name()]; ctl != nil {
			ms = append(ms, measured{ctl, evidenceKey(m)})
		}
		g.shaping.mu.Unlock()
	}
	if len(ms) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	rec := &statusRecorder{ResponseWriter: w, now: g.lim.Now}
	lt := &latencyTrace{now: g.lim.Now, sent: g.lim.Now()}
	r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { lt.mark(&lt.sent) },
		GotFirstResponseByte: func() { lt.mark(&lt.first) },
		Got1xxResponse:       lt.interim,
	}))
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &bodyEnd{ReadCloser: r.Body, lt: lt}
	}
	next.ServeHTTP(rec, r)
	status, at := rec.status, rec.at
	if status == 0 {
		if r.Context().Err() != nil {
			// The client went away before any answer: nothing is known
			// of the upstream.
			status = 0
		} else {
			status, at = http.StatusOK, g.lim.Now() // net/http's implicit 200
		}
	}
	latency := lt.latency(at)
	ctx, cancel := deadline.WithTimeout(context.WithoutCancel(r.Context()), g.opts.StoreTimeout)
	defer cancel()
	now := g.lim.Now()
	for _, m := range ms {
		m.ctl.Observe(m.key, status, latency)
		g.tick(ctx, m.ctl, now)
	}
}

// evidenceKey is whose answer a response of m is, for an adaptive
// limit's per-key verdict: the rule's key, or, for a rule without
// limit_keys (one key for every client), the client's identity (its
// verified JWT subject, else its address).
func evidenceKey(m *policy.Match) string {
	if m.Rule != nil && len(m.Rule.LimitKeys) == 0 && m.Identity != "" {
		return m.Identity
	}
	return m.Request.Key
}

// latencyTrace notes when a request was fully sent and when the first
// byte of its answer came; the transport's trace hooks and the body run
// on other goroutines.
type latencyTrace struct {
	now         func() time.Time
	mu          sync.Mutex
	sent, first time.Time
	// informational: the first byte was an interim answer (100 Continue,
	// which a client's Expect header makes the upstream send before it
	// has done anything), so the answer's time is its headers'.
	informational bool
}

// interim notes a 1xx answer (httptrace's Got1xxResponse).
func (l *latencyTrace) interim(int, textproto.MIMEHeader) error {
	l.mu.Lock()
	l.informational = true
	l.mu.Unlock()
	return nil
}

func (l *latencyTrace) mark(t *time.Time) {
	now := l.now()
	l.mu.Lock()
	if t == &l.sent {
		// The latest of the marks: the body's end, then the request's.
		*t = later(*t, now)
	} else if t.IsZero() {
		*t = now
	}
	l.mu.Unlock()
}

// latency is from the request's sending to its first byte, or headers
// (at) where no transport told the first byte; zero when the answer came
// before the request was all sent (an upstream refusing a body early).
func (l *latencyTrace) latency(headers time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.first
	if first.IsZero() || l.informational {
		first = headers
	}
	return max(first.Sub(l.sent), 0)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// bodyEnd marks when the handler has read the request's body to its end:
// the client's upload is over.
type bodyEnd struct {
	io.ReadCloser
	lt *latencyTrace
}

func (b *bodyEnd) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.lt.mark(&b.lt.sent)
	}
	return n, err
}

// statusRecorder notes the status of a response and when its headers
// were written. It passes Flush, Hijack and Unwrap (http.ResponseController)
// through, so that event streams and websocket upgrades work through it.
type statusRecorder struct {
	http.ResponseWriter
	now    func() time.Time
	status int
	at     time.Time
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		s.status, s.at = code, s.now()
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status, s.at = http.StatusOK, s.now()
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() {
	if s.status == 0 {
		s.status, s.at = http.StatusOK, s.now()
	}
	http.NewResponseController(s.ResponseWriter).Flush()
}

func (s *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil && s.status == 0 {
		s.status, s.at = http.StatusSwitchingProtocols, s.now()
	}
	return conn, brw, err
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
