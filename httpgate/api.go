package httpgate

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/jwtauth"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/settle"
)

// Bounds on decision API requests: a body never needs more, and a key or
// batch beyond them is a mistake or abuse.
const (
	maxBody  = 64 << 10
	maxKey   = 1024
	maxTakes = 100
)

// TakeRequest is the body of /v1/take and /v1/peek: one take (Rule, Key,
// Cost, Reserve) or several (Takes), decided all-or-nothing.
type TakeRequest struct {
	Rule    string     `json:"rule,omitempty"`
	Key     string     `json:"key,omitempty"`
	Cost    *float64   `json:"cost,omitempty"`
	Reserve bool       `json:"reserve,omitempty"`
	Takes   []TakeItem `json:"takes,omitempty"`
}

// TakeItem is one take of a batch.
type TakeItem struct {
	Rule    string   `json:"rule"`
	Key     string   `json:"key"`
	Cost    *float64 `json:"cost,omitempty"`
	Reserve bool     `json:"reserve,omitempty"`
}

// DecisionResponse is the answer of /v1/take and /v1/peek. For a batch it
// is the overall decision (the rejection with the longest wait, or the
// limit closest to rejecting) with one entry per take in Takes.
type DecisionResponse struct {
	Allowed   bool  `json:"allowed"`
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	// Tokens is the exact number of tokens the bucket holds after this
	// decision: fractional, and negative while a reservation is in debt
	// (Remaining is its whole part, never below 0).
	Tokens       float64 `json:"tokens"`
	RetryAfterMs int64   `json:"retry_after_ms"`
	ResetAfterMs int64   `json:"reset_after_ms"`
	Rule         string  `json:"rule"`
	// RetryAt is when retry_after_ms ends: the server's clock when it
	// answered plus the wait, rounded up to the millisecond, RFC 3339 in
	// UTC (sluice.RetryAtLayout); absent when there is no wait.
	RetryAt string `json:"retry_at,omitempty"`
	// Reason says why the request was rejected ("token_bucket_exceeded",
	// "store_unavailable"); "" when allowed. For a shadow-mode rule it
	// says why enforcing would have rejected.
	Reason string `json:"reason"`
	Key    string `json:"key,omitempty"`
	// Shadow marks a shadow-mode rule's entry: never rejected.
	Shadow bool `json:"shadow,omitempty"`
	// StoreError is set when the store failed and the rule's
	// on_store_error decided.
	StoreError bool `json:"store_error,omitempty"`
	// Lease is the slot an admitted take of a concurrency rule holds: 32
	// hexadecimal digits to give /v1/release when the work ends. The slot
	// is freed without it LeaseMs after the take.
	Lease   string             `json:"lease,omitempty"`
	LeaseMs int64              `json:"lease_ms,omitempty"`
	Takes   []DecisionResponse `json:"takes,omitempty"`
	// Settle is the handle that settles an admitted take of a limit with
	// settle_from at its actual cost (POST /v1/settle); absent otherwise.
	Settle string `json:"settle,omitempty"`
}

// ResetRequest is the body of /v1/reset.
type ResetRequest struct {
	Rule string `json:"rule"`
	Key  string `json:"key"`
}

// Handler serves the decision API, forward auth, metrics and health on
// one listener:
//
//	POST /v1/take, POST /v1/peek, POST /v1/release, POST /v1/renew,
//	POST /v1/reset, POST /v1/settle, ANY /v1/auth (and /v1/auth/..., for Envoy's ext_authz),
//	GET /metrics, GET /healthz, GET /readyz,
//	GET / (the list of these, as an Index), GET /openapi.yaml
//
// Every other path is a 404, and another method a 405 with Allow, both
// application/problem+json.
//
// When the policy names an api_token_env, /v1/take, /v1/peek, /v1/release,
// /v1/renew, /v1/settle and /v1/auth require its token (see RequireToken).
func (g *Gate) Handler() http.Handler { return g.handler(true, true) }

// AuthHandler serves forward auth and health (ANY /v1/auth, GET /healthz,
// GET /readyz): what faces the front proxy when the decision API has a
// listener of its own (api_listen).
func (g *Gate) AuthHandler() http.Handler { return g.handler(true, false) }

// APIHandler serves the decision API, reset, metrics and health (POST
// /v1/take, /v1/peek, /v1/release, /v1/renew, /v1/reset, /v1/settle, GET
// /metrics, /healthz, /readyz): what faces trusted services when it has a listener of its own
// (api_listen).
func (g *Gate) APIHandler() http.Handler { return g.handler(false, true) }

func (g *Gate) handler(auth, api bool) http.Handler {
	var routes []route
	take := g.RequireToken(BearerSource, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.decide(w, r, engine.OpTake) }))
	if api {
		routes = append(routes,
			route{"POST", takePath, `take tokens: {"rule","key","cost","reserve"} or {"takes":[...]}, all-or-nothing`, take},
			route{"POST", "/v1/peek", "what /v1/take would answer, consuming nothing",
				g.RequireToken(BearerSource, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.decide(w, r, engine.OpPeek) }))},
			route{"POST", "/v1/reset", `refill a bucket: {"rule","key"}; needs the admin token`, http.HandlerFunc(g.reset)},
			route{"POST", "/v1/settle", `settle a take at its actual cost: {"handle","actual"}`,
				g.RequireToken(BearerSource, http.HandlerFunc(g.settleAPI))},
			route{"POST", "/v1/release", `free a concurrency slot: {"rule","key","lease"} with the lease /v1/take returned`,
				g.RequireToken(BearerSource, http.HandlerFunc(g.release))},
			route{"POST", "/v1/renew", `hold a concurrency slot for another lease: {"rule","key","lease"} with the lease /v1/take returned`,
				g.RequireToken(BearerSource, http.HandlerFunc(g.renew))},
		)
		if g.opts.Metrics != nil {
			routes = append(routes, route{"GET", "/metrics", "Prometheus metrics", g.opts.Metrics.Handler()})
		}
		if g.opts.Insight != nil {
			routes = append(routes, g.uiRoutes()...)
		}
	}
	// The Authorization header of a forward-auth call is the client's own
	// (JWT rules read it), so sluice's token travels beside it.
	forwardAuth := g.RequireToken(TokenHeader, http.HandlerFunc(g.ForwardAuth))
	if auth {
		routes = append(routes, route{"", "/v1/auth", "forward auth (nginx auth_request, Traefik, Caddy; Envoy ext_authz at /v1/auth/...)", forwardAuth})
	}
	routes = append(routes,
		route{"GET", "/healthz", "liveness", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			io.WriteString(w, "ok\n")
		})},
		route{"GET", "/readyz", "readiness: the store answers and the server is not shutting down", http.HandlerFunc(g.ready)},
		route{"GET", "/healthcheck", "the reference rate limit service's health check: OK unless shutting down", http.HandlerFunc(g.healthcheck)},
	)
	mux := serveRoutes(routes)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Envoy's ext_authz calls /v1/auth followed by the original path,
		// which the mux would clean and redirect (//x, /a/../b): forward
		// auth reads it as sent, with the same token as /v1/auth, and only
		// where /v1/auth is served.
		if auth && strings.HasPrefix(r.URL.Path, forwardAuthPath+"/") {
			forwardAuth.ServeHTTP(w, r)
			return
		}
		// The calls that come by the thousand go straight to their
		// handler, as the mux would send them (a path without escapes is
		// matched as it is), without the cost of its lookup.
		if r.URL.RawPath == "" {
			switch {
			case auth && r.URL.Path == forwardAuthPath:
				forwardAuth.ServeHTTP(w, r)
				return
			case api && r.URL.Path == takePath && r.Method == http.MethodPost:
				take.ServeHTTP(w, r)
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
}

// takePath is where the decision API takes.
const takePath = "/v1/take"

// TokenHeader carries the api token on /v1/auth, where Authorization
// belongs to the client whose request is judged.
const TokenHeader = "X-Sluice-Token"

// BearerSource names the Authorization: Bearer header as where a token
// is read from (on /v1/take and /v1/peek).
const BearerSource = "Authorization"

// RequireToken wraps h so that it answers only callers presenting the
// token held in the environment variable the policy's api_token_env names
// (read on every call, so the policy in force decides): from
// "Authorization: Bearer TOKEN" when from is BearerSource, else from the
// header named from (TokenHeader). Without api_token_env, h is open, but
// from BearerSource a request with an Origin (a browser's) is a 403. A
// missing or wrong token is a 401 problem with a Bearer challenge.
func (g *Gate) RequireToken(from string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env := g.Policy().Settings.APITokenEnv
		switch {
		case env == "" && from == BearerSource && r.Header.Get("Origin") != "":
			// Without a token the address is the guard, which a browser inside crosses (a page's
			// no-cors POST, DNS rebinding): browsers send Origin with every POST, services none.
			badRequest(w, http.StatusForbidden, "a request from a browser (it has an Origin) is refused while the decision API has no token (api_token_env)")
		case env == "":
			h.ServeHTTP(w, r)
		default:
			got, how := strings.TrimSpace(r.Header.Get(from)), from+": <token>"
			if from == BearerSource {
				got, how = jwtauth.BearerToken(r.Header), "Authorization: Bearer <token>"
			}
			if ok, wait := g.checkServiceToken(r, got, g.opts.Getenv(env)); !ok {
				refuseToken(w, wait, "a valid API token is required: "+how+" (the token of api_token_env)")
				return
			}
			h.ServeHTTP(w, r)
		}
	})
}

// tokenMatches compares a presented token with the configured one without
// leaking, through timing, either its content or its length: the digests
// are compared. An empty configured token matches nothing.
func tokenMatches(got, want string) bool {
	if want == "" || got == "" {
		return false
	}
	gs, ws := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(gs[:], ws[:]) == 1
}

// readyProbe is peeked at by /readyz: a round trip to the store that
// creates no state.
var readyProbe = sluice.MustLimit(sluice.Spec{Name: "sluice-readyz", TokensPerSecond: 1, Burst: 1})

func (g *Gate) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := g.Ready(ctx); err != nil {
		var nr notReady
		switch {
		case errors.Is(err, errDraining):
			badRequest(w, http.StatusServiceUnavailable, "shutting down")
			return
		case errors.As(err, &nr):
			badRequest(w, http.StatusServiceUnavailable, nr.Error())
			return
		}
		// The store's error names its address: it goes to the log.
		g.storeLog.Log(g.opts.Logger, readyProbe.Name(), "probe", err, false)
		badRequest(w, http.StatusServiceUnavailable, "the store did not answer (the error is in the server's log)")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ready\n")
}

// errDraining is Ready's answer once Drain was called.
var errDraining = errors.New("shutting down")

// notReady is Options.Ready's refusal, which /readyz says as it is.
type notReady struct{ error }

// readiness is a store with its own rule for when it is usable as a
// whole (the Redis store: at least one node answers), which /readyz
// asks instead of a peek: a peek reads one key, which on a Cluster is one
// primary's slot, and that primary down would make the whole process
// unready while the others serve their slots.
type readiness interface {
	Ready(ctx context.Context) error
}

// Ready is what /readyz answers: nil when the server is not shutting
// down and the store is usable, within ctx: by the store's own rule
// (readiness), or else when it answers a peek; and Options.Ready, when
// set, has nothing against it.
func (g *Gate) Ready(ctx context.Context) error {
	if g.draining.Load() {
		return errDraining
	}
	if r, ok := beneath[readiness](g.lim.Store()); ok {
		if err := r.Ready(ctx); err != nil {
			return fmt.Errorf("readiness probe: %w", err)
		}
	} else if _, err := g.lim.Peek(ctx, sluice.Request{Limit: readyProbe, Key: "probe"}); err != nil {
		return fmt.Errorf("readiness probe: %w", err)
	}
	if g.opts.Ready != nil {
		if err := g.opts.Ready(); err != nil {
			return notReady{err}
		}
	}
	return nil
}

// healthcheck answers as the reference rate limit service's health check
// does, for deployments that probe it (Envoy Gateway's): 200 "OK" while
// serving, 500 once shutting down or while Options.Healthy refuses. It
// asks no store: the reference's does not either, and a probe that
// restarts the server while its store is away would only add a cold
// start to the outage.
func (g *Gate) healthcheck(w http.ResponseWriter, _ *http.Request) {
	err := error(nil)
	if g.draining.Load() {
		err = errDraining
	} else if g.opts.Healthy != nil {
		err = g.opts.Healthy()
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, err.Error()+"\n")
		return
	}
	io.WriteString(w, "OK")
}

// decodeBody reads a JSON body into v strictly: bounded size, no unknown
// fields, nothing after the value (see decodeJSON). It writes the 4xx
// itself and reports whether decoding succeeded.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	buf := getBuf()
	defer putBuf(buf)
	data, ok := readBody(w, r, buf)
	if !ok {
		return false
	}
	if msg := decodeJSON(data, v); msg != "" {
		badRequest(w, http.StatusBadRequest, msg)
		return false
	}
	return true
}

// decodeTake is decodeBody for the body of /v1/take and /v1/peek, read
// by parseSimpleTake when it can (with the names of p's limits).
func decodeTake(w http.ResponseWriter, r *http.Request, p *policy.Policy) (TakeRequest, bool) {
	buf := getBuf()
	defer putBuf(buf)
	data, ok := readBody(w, r, buf)
	if !ok {
		return TakeRequest{}, false
	}
	if req, ok := parseSimpleTake(data, p.LimitName); ok {
		return req, true
	}
	var req TakeRequest
	if msg := decodeJSON(data, &req); msg != "" {
		badRequest(w, http.StatusBadRequest, msg)
		return req, false
	}
	return req, true
}

// readBody reads r's body, at most maxBody bytes, into buf (a pooled
// buffer), writing the 4xx itself when it cannot.
func readBody(w http.ResponseWriter, r *http.Request, buf *[]byte) ([]byte, bool) {
	// A body of a declared length within the bound ends there (the
	// server reads no further), and the common call needs no reader of
	// its own; readAll's bound still holds should one send more. A body
	// of no declared length, or too long a one, is read through
	// MaxBytesReader, which also has the server close the connection
	// rather than read on.
	body := r.Body
	if r.ContentLength < 0 || r.ContentLength > maxBody {
		body = http.MaxBytesReader(w, r.Body, maxBody)
	}
	data, err := readAll(body, *buf, maxBody)
	*buf = data
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			if body == r.Body { // readAll's bound: the server may not know
				w.Header().Set("Connection", "close")
			}
			badRequest(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", mbe.Limit))
			return nil, false
		}
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			badRequest(w, http.StatusRequestTimeout, "the body did not arrive in time (server.read_timeout)")
			return nil, false
		}
		badRequest(w, http.StatusBadRequest, "the body could not be read: the connection failed or the body ended early")
		return nil, false
	}
	return data, true
}

// readAll is io.ReadAll reading into b (from its length on), which it
// grows as needed, of at most limit bytes: one more is a
// *http.MaxBytesError, as http.MaxBytesReader reports it.
func readAll(r io.Reader, b []byte, limit int64) ([]byte, error) {
	start := len(b)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		room := b[len(b):cap(b)]
		if left := limit + 1 - int64(len(b)-start); int64(len(room)) > left {
			room = room[:left]
		}
		n, err := r.Read(room)
		b = b[:len(b)+n]
		if int64(len(b)-start) > limit {
			return b, &http.MaxBytesError{Limit: limit}
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// keyRequired answers a take or reset without a key. An absent key would
// be the empty one, shared by every caller that leaves it out: one bucket
// for everyone by omission. A bucket meant to be shared is named.
const keyRequired = `"key" is required: the bucket's key, such as a user or client id (a bucket shared by every caller is one key they all send, such as "global")`

// inputError is a request the decision API refuses, with its status.
type inputError struct {
	status int
	msg    string
}

func (g *Gate) decide(w http.ResponseWriter, r *http.Request, op engine.Op) {
	p := g.Policy()
	body, ok := decodeTake(w, r, p)
	if !ok {
		return
	}
	items := body.Takes
	var one [1]TakeItem
	single := len(items) == 0
	switch {
	case body.Takes != nil && len(body.Takes) == 0:
		badRequest(w, http.StatusBadRequest, `"takes" is empty: give at least one take`)
		return
	case single && body.Rule == "" && body.Key == "" && body.Cost == nil:
		badRequest(w, http.StatusBadRequest, `give "rule" and "key", or "takes"`)
		return
	case single:
		one[0] = TakeItem{Rule: body.Rule, Key: body.Key, Cost: body.Cost, Reserve: body.Reserve}
		items = one[:]
	case body.Rule != "" || body.Key != "" || body.Cost != nil || body.Reserve:
		badRequest(w, http.StatusBadRequest, `give either "rule"/"key"/"cost"/"reserve" or "takes", not both`)
		return
	case len(items) > maxTakes:
		badRequest(w, http.StatusBadRequest, fmt.Sprintf("at most %d takes per request, got %d", maxTakes, len(items)))
		return
	}
	// The call is over when decide returns (a slot it holds is the
	// store's, named by its lease): what it decides with is pooled.
	sc := getScratch()
	defer putScratch(sc)
	ms := sc.Matches(len(items))
	for i, it := range items {
		m, ie := matchFor(p, it)
		if ie != nil {
			msg := ie.msg
			if !single {
				msg = fmt.Sprintf("takes[%d]: %s", i, msg)
			}
			badRequest(w, ie.status, msg)
			return
		}
		ms[i] = m
	}
	in := sc.FromHTTP(p, r)
	ctx, cancel := deadline.ForStore(withCaller(r.Context(), ms, in.ClientIP, r.URL.Path), g.lim.Store(), g.opts.StoreTimeout)
	defer cancel()
	var obs policy.Observer
	if op == engine.OpTake {
		obs = g.obs
	}
	// A concurrency rule's slot outlives this call: the caller releases it
	// with /v1/release, or its lease ends.
	v := policy.Enforce(ctx, g.lim, ms, policy.Options{Op: op, Hold: true, Scratch: sc, Observer: obs})
	if op == engine.OpTake {
		g.record(ctx, &v, in.ClientIP, r.URL.Path)
	}
	if r.Context().Err() != nil {
		// The caller has gone and will never read its leases' ids: the
		// acquire ran on (see sluice.Limiter.Acquire), and its slots are
		// given back now rather than held for a lease.
		v.Release(r.Context())
	}
	var out DecisionResponse
	if single {
		// One take: the answer is that take's, without its key.
		g.entry(&out, p, op, &v, &v.Results[0])
		out.Key = ""
	} else {
		entries := make([]DecisionResponse, len(v.Results))
		for i := range v.Results {
			g.entry(&entries[i], p, op, &v, &v.Results[i])
		}
		out = DecisionResponse{Allowed: v.Allowed, Reason: v.Reason(), Takes: entries}
		fill(&out, v.Overall, !v.Allowed)
	}
	var now time.Time // read for the first wait, if there is one
	setRetryAt(&out, func() time.Time {
		if now.IsZero() {
			now = g.lim.Now()
		}
		return now
	})
	writeDecision(w, &out)
}

// entry fills e with the answer of one take of v, decided under p.
func (g *Gate) entry(e *DecisionResponse, p *policy.Policy, op engine.Op, v *policy.Verdict, rr *policy.Result) {
	*e = DecisionResponse{Allowed: rr.Decision.Allowed || rr.Shadow, Reason: rr.Reason(), Key: rr.Match.Request.Key, Shadow: rr.Shadow, StoreError: rr.StoreErr != nil}
	fill(e, rr.Effective(rr.Decision.Allowed), rr.Refused())
	if op == engine.OpTake && v.Allowed && rr.Match.Settle != nil && rr.Decision.Allowed && rr.StoreErr == nil {
		req := rr.Match.Request
		e.Settle = settle.Issue(g.settleKey(p), req.Limit.Name(), req.Key, req.Cost, g.lim.Now().Add(g.opts.SettleTTL))
	}
	if rr.Lease.Held() {
		e.Lease, e.LeaseMs = rr.Lease.ID().String(), ceilMillis(rr.Lease.Limit().LeaseTerm())
	}
}

// writeDecision writes out as the decision API's 200. A function of its
// own, so that decide's deferred calls stay few enough for the compiler
// to inline them (open-coded defers).
func writeDecision(w http.ResponseWriter, out *DecisionResponse) {
	h := w.Header()
	h["Cache-Control"] = noStore
	buf := getBuf()
	defer putBuf(buf)
	b, ok := appendDecision(*buf, out)
	if !ok { // what writeJSON answers when json.Marshal fails alike
		badRequest(w, http.StatusInternalServerError, "the answer could not be encoded")
		return
	}
	*buf = append(b, '\n')
	h["Content-Type"] = jsonType
	w.WriteHeader(http.StatusOK)
	w.Write(*buf)
}

// jsonType is the Content-Type of the decision API's answers, shared as
// noStore is.
var jsonType = []string{"application/json"}

// setRetryAt fills the retry_at of out and its takes from their
// retry_after_ms, as of now(): the time the answer is written, after the
// store decided, so it is never early. now is called only for a wait.
func setRetryAt(out *DecisionResponse, now func() time.Time) {
	if out.RetryAfterMs > 0 {
		out.RetryAt = retryAt(now(), out.RetryAfterMs)
	}
	for i := range out.Takes {
		setRetryAt(&out.Takes[i], now)
	}
}

// retryAt is now plus ms milliseconds, rounded up to the millisecond, in
// sluice.RetryAtLayout.
func retryAt(now time.Time, ms int64) string {
	at := now.Add(time.Duration(ms) * time.Millisecond)
	if t := at.Truncate(time.Millisecond); t.Before(at) {
		at = t.Add(time.Millisecond)
	}
	return at.UTC().Format(sluice.RetryAtLayout)
}

// matchFor validates one take against p and builds its Match.
func matchFor(p *policy.Policy, it TakeItem) (policy.Match, *inputError) {
	if it.Rule == "" {
		return policy.Match{}, &inputError{http.StatusBadRequest, `"rule" is required`}
	}
	rule, lim, err := p.FindLimit(it.Rule)
	if err != nil {
		return policy.Match{}, &inputError{http.StatusBadRequest, err.Error()}
	}
	if it.Key == "" {
		return policy.Match{}, &inputError{http.StatusBadRequest, keyRequired}
	}
	if len(it.Key) > maxKey {
		return policy.Match{}, &inputError{http.StatusBadRequest, fmt.Sprintf("key is %d bytes, at most %d", len(it.Key), maxKey)}
	}
	cost := 1.0
	if it.Cost != nil {
		// The library's zero Cost means one token, as Go's zero values
		// do; JSON has no zero value, so an explicit 0 asks for nothing.
		cost = *it.Cost
		if cost == 0 {
			return policy.Match{}, &inputError{http.StatusBadRequest, `cost 0 takes nothing: give a cost > 0, or leave "cost" out to take 1 token`}
		}
	}
	req := sluice.Request{Limit: lim, Key: it.Key, Cost: cost, Reserve: it.Reserve}
	if lim.Algorithm() == sluice.Concurrency {
		if err := req.CheckLease(); err != nil {
			return policy.Match{}, &inputError{http.StatusBadRequest, fmt.Sprintf("%q is a concurrency rule: a take holds one slot, with no cost other than 1 and no reserve", lim.Name())}
		}
		return policy.Match{Rule: rule, Request: req, Identity: it.Key}, nil
	}
	m := policy.Match{Rule: rule, Request: req, Identity: it.Key, Settle: rule.SettleFrom(lim)}
	if err := m.Judge(); err != nil {
		// Request.Charged's rule and words: a cost above the most the
		// limit can charge (1e308 included) can never succeed.
		if errors.Is(err, sluice.ErrCostExceedsLimit) {
			return policy.Match{}, &inputError{http.StatusUnprocessableEntity, err.Error()}
		}
		return policy.Match{}, &inputError{http.StatusBadRequest, err.Error()}
	}
	return m, nil
}

// fill copies d into out; a limit that rejected has nothing remaining.
func fill(out *DecisionResponse, d sluice.Decision, rejected bool) {
	out.Limit = d.Capacity
	out.Remaining = max(d.Remaining, 0)
	if rejected {
		out.Remaining = 0
	}
	out.Tokens = d.Tokens
	out.RetryAfterMs = ceilMillis(d.RetryAfter)
	out.ResetAfterMs = ceilMillis(d.ResetAfter)
	out.Rule = d.Rule
}

func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // the answers are plain structs: unreachable
		badRequest(w, http.StatusInternalServerError, "the answer could not be encoded")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// reset refills a key's bucket; it needs the admin token.
func (g *Gate) reset(w http.ResponseWriter, r *http.Request) {
	p := g.Policy()
	if !g.admin(w, r, p) {
		return
	}
	var body ResetRequest
	if !decodeBody(w, r, &body) {
		return
	}
	g.resetBucket(w, r, p, body)
}

// resetBucket refills the bucket body names under p; the caller checked
// the admin token.
func (g *Gate) resetBucket(w http.ResponseWriter, r *http.Request, p *policy.Policy, body ResetRequest) {
	if body.Rule == "" {
		badRequest(w, http.StatusBadRequest, `"rule" is required`)
		return
	}
	_, lim, err := p.FindLimit(body.Rule)
	if err != nil {
		badRequest(w, http.StatusBadRequest, err.Error())
		return
	}
	if body.Key == "" {
		badRequest(w, http.StatusBadRequest, keyRequired)
		return
	}
	ctx, cancel := deadline.WithTimeout(r.Context(), g.opts.StoreTimeout)
	defer cancel()
	if err := g.lim.Reset(ctx, lim, body.Key); err != nil {
		// The store's error names its address: it goes to the log.
		g.opts.Logger.Error("reset", "rule", body.Rule, "err", err)
		badRequest(w, http.StatusServiceUnavailable, fmt.Sprintf("reset %q: the store did not answer (the error is in the server's log)", body.Rule))
		return
	}
	g.opts.Logger.Info("reset", "rule", body.Rule, "key", body.Key, "peer", r.RemoteAddr)
	writeJSON(w, http.StatusOK, map[string]any{"reset": true, "rule": body.Rule, "key": body.Key})
}

// admin checks the bearer token against the one in the environment
// variable the policy names. Without a configured token the admin API is
// disabled rather than open.
func (g *Gate) admin(w http.ResponseWriter, r *http.Request, p *policy.Policy) bool {
	want := ""
	if env := p.Settings.AdminTokenEnv; env != "" {
		want = g.opts.Getenv(env)
	}
	if want == "" {
		badRequest(w, http.StatusForbidden, "reset is disabled: no admin token is configured (admin_token_env)")
		return false
	}
	if ok, wait := g.checkToken(r, jwtauth.BearerToken(r.Header), want); !ok {
		refuseToken(w, wait, "a valid admin token is required: Authorization: Bearer <token>")
		return false
	}
	return true
}
