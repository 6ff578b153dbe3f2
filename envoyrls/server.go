package envoyrls

import (
	"cmp"
	"context"
	"log/slog"
	"math"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/serverconf"
)

// ServiceName is the gRPC service sluice answers, as Envoy names it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Bounds on a request, so that a hostile caller cannot make one call
// arbitrarily expensive or fill the store with huge keys. Each bounds one
// part; Options.MaxRequestBytes bounds their bytes together, so that the
// product of these (16 MiB of keys and values) is never one call.
const (
	maxDescriptors = 64
	maxEntries     = 32
	maxEntryBytes  = 4096
	// maxHits bounds hits_addend: more than any limit can hold is an
	// impossible cost either way, and a float64 holds it exactly.
	maxHits = 1 << 40
)

// Options configures a Server.
type Options struct {
	// StoreTimeout bounds each store call (default 250ms); Envoy's own
	// deadline, when shorter, applies too. A call that runs out of time is
	// a store failure, decided by each rule's on_store_error.
	StoreTimeout time.Duration
	// Logger receives store failures (default slog.Default()).
	Logger *slog.Logger
	// Observer, when set, is told every rule's decision (metrics).
	Observer policy.Observer
	// MaxRequestBytes bounds a call's domain, keys and values together
	// (default serverconf.DefaultGRPCLimits.MaxRecvBytes): a call past it is
	// refused (InvalidArgument). A server given LimitOptions refuses a
	// larger message before reading it; this holds the bound on any
	// server.
	MaxRequestBytes int
	// Source, when set, is asked for the policy in force at every call, so
	// that the server follows a reload (sluice serve passes the HTTP
	// gate's policy); the policy given to New is used until it answers.
	Source func() *policy.Policy
}

// Server implements envoy.service.ratelimit.v3.RateLimitService over a
// sluice Limiter. It is safe for concurrent use; SetPolicy swaps the rules
// without dropping a call.
type Server struct {
	rlspb.UnimplementedRateLimitServiceServer

	lim     *sluice.Limiter
	loaded  atomic.Pointer[loaded]
	timeout time.Duration
	maxReq  int
	log     *slog.Logger
	obs     policy.Observer
	source  func() *policy.Policy
	limits  sync.Map // *sluice.Limit -> *rlspb.RateLimitResponse_RateLimit
	// loading is held by the call that loads a policy the source has
	// just answered (current); loads counts the policies loaded.
	loading sync.Mutex
	loads   atomic.Int64
	// storeLog keeps an outage from writing a line per call.
	storeLog policy.StoreErrorLog
}

// loaded is one loaded policy and the Matcher its descriptors are found
// with.
type loaded struct {
	pol     *policy.Policy
	match   Matcher
	headers []string
	// shadowAll is the reference server's SHADOW_MODE: every call is
	// answered OK overall, its statuses as they are (Modes).
	shadowAll bool
	// limits is the current_limit that each of pol's limits reports, made
	// with the loaded policy rather than looked up per call.
	limits map[*sluice.Limit]*rlspb.RateLimitResponse_RateLimit
}

// New returns a Server enforcing pol on lim. A policy returned by
// ParseReferenceConfig is enforced with its *Reference, the reference
// server's lookup (see the package documentation); any other policy
// matches descriptors with its rules' match and limit_keys.
func New(pol *policy.Policy, lim *sluice.Limiter, opts Options) *Server {
	if opts.StoreTimeout <= 0 {
		opts.StoreTimeout = 250 * time.Millisecond
	}
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = serverconf.DefaultGRPCLimits.MaxRecvBytes
	}
	s := &Server{lim: lim, timeout: opts.StoreTimeout, maxReq: opts.MaxRequestBytes, log: opts.Logger, obs: opts.Observer, source: opts.Source}
	s.SetPolicy(pol)
	return s
}

// SetPolicy makes pol, and its Matcher, the policy of every call that
// starts after it.
func (s *Server) SetPolicy(pol *policy.Policy) { s.setPolicy(pol) }

func (s *Server) setPolicy(pol *policy.Policy) *loaded {
	if pol == nil {
		pol = &policy.Policy{} // no rules: nothing is limited
	}
	e := &loaded{pol: pol, match: matcherOf(pol), headers: pol.Settings.Headers, limits: map[*sluice.Limit]*rlspb.RateLimitResponse_RateLimit{}}
	if ref := referenceOf(pol); ref != nil {
		e.shadowAll = ref.modes.Shadow
	}
	for _, l := range pol.Limits() {
		e.limits[l] = inferLimit(l.Name(), l)
	}
	s.loads.Add(1)
	s.loaded.Store(e)
	s.limits.Clear() // the old policy's limits are no longer asked about
	return e
}

// Register adds the rate limit service, the standard health service
// (reporting SERVING for "" and ServiceName) and server reflection to g.
// On a server with ServerOptions (in a binary built with -tags
// vtprotobuf), a call's request and response are held in memory reused
// for a later call once the response is marshalled by the codec, unless
// the server has an interceptor or grpc-go's binary log is on: a stats
// handler on such a server must not keep InPayload.Payload or
// OutPayload.Payload past HandleRPC (grpc-go's own rule for them).
func (s *Server) Register(g *grpc.Server) *health.Server {
	g.RegisterService(&serviceDesc, s)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, h)
	reflection.Register(g)
	return h
}

// serviceDesc is the rate limit service as go-control-plane describes it,
// but that ShouldRateLimit is answered by handleShouldRateLimit.
var serviceDesc = func() grpc.ServiceDesc {
	d := rlspb.RateLimitService_ServiceDesc
	d.Methods = slices.Clone(d.Methods)
	for i := range d.Methods {
		if d.Methods[i].MethodName == "ShouldRateLimit" {
			generated := d.Methods[i].Handler
			d.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				return handleShouldRateLimit(srv, ctx, dec, interceptor, generated)
			}
		}
	}
	return d
}()

// recycling says whether a response can go back to recycledPool once it
// is marshalled: only the codec gives it back (a server without it lets
// the collector have it, as any response), and grpc-go's binary log, which
// reads a response after sending it, must be off.
var recycling = vtCompiled && os.Getenv("GRPC_BINARY_LOG_FILTER") == ""

// handleShouldRateLimit is the generated handler, except that the request
// is decoded, and a call of one descriptor (the usual) answered, in
// recycled memory when nothing but the codec sees the response: no
// interceptor stands between the handler and grpc-go.
func handleShouldRateLimit(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor, generated grpc.MethodHandler) (any, error) {
	defer leave(ctx)
	s, ok := srv.(*Server)
	if !ok || interceptor != nil || !recycling {
		return generated(srv, ctx, dec, interceptor)
	}
	r := recycledPool.Get().(*recycled)
	req := &r.req // decoding resets it
	if err := dec(req); err != nil {
		r.release()
		return nil, err
	}
	resp, err := s.answer(ctx, req, r)
	if err != nil || resp != r.RateLimitResponse { // not one descriptor
		r.release()
		return resp, err
	}
	return r, nil
}

// ServerOptions are the gRPC server options sluice serves Envoy with.
// Envoy keeps a few long-lived HTTP/2 connections and sends many small
// calls on each, so write buffers are shared rather than kept per
// connection, and calls run on long-lived worker goroutines: a goroutine
// per call starts with a small stack and grows it through gRPC's and the
// store's frames every time, which cost about a seventh of the CPU of a
// loaded server. Calls beyond the workers (all busy, e.g. waiting on
// Redis) still get a goroutine of their own. Requests are decoded by the
// server's codec, which reads the usual RateLimitRequest without
// protobuf's reflection; in a binary built with the build tag
// vtprotobuf, it also marshals responses with go-control-plane's
// generated code (see codec). Both on this server only.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.SharedWriteBuffer(true),
		grpc.NumStreamWorkers(uint32(max(64, 16*runtime.GOMAXPROCS(0)))),
		grpc.ForceServerCodecV2(newCodec()),
	}
}

// descKind says how one descriptor's cost is applied.
type descKind uint8

const (
	kindTake   descKind = iota // charge its hits
	kindPeek                   // hits_addend 0: check without charging
	kindRefund                 // is_negative_hits: gives tokens back (engine.OpRefund)
)

// descState is how one descriptor of a call is decided.
type descState struct {
	kind     descKind
	cost     float64
	tooBig   bool // its cost exceeds an enforce-mode limit's capacity
	first, n int  // its limits: groups[kind].ms[first:first+n]

	// Set by decide: the results of its limits, whether they charged (or
	// refunded) its buckets, whether it is over its limit, and, for a soft
	// descriptor over its limit, that it was left out of the charge.
	rrs      []policy.Result
	charged  bool
	over     bool
	excluded bool
}

// group is the matches decided in one policy.Enforce.
type group struct {
	ms      []policy.Match
	res     policy.Verdict
	decided bool // res is set: the group has matches
	op      engine.Op
}

// call is one ShouldRateLimit while it is decided, apart from what the
// Matcher found (which goes through an interface, and would take the
// buffers below to the heap with it).
type call struct {
	req    *rlspb.RateLimitRequest
	ds     []descState // how each descriptor is decided
	found  []Found     // what applies to each descriptor
	groups [3]group    // the limits of every descriptor, by kind
	// shadowAll: SHADOW_MODE (engine.shadowAll).
	shadowAll bool
	allowed   bool // the call's answer, once decided
}

// ShouldRateLimit implements RateLimitServiceServer: it finds what applies
// to each descriptor (the policy's Matcher), decides the limits found in
// the store (decide) and answers with a status per descriptor and the
// RateLimit headers (respond).
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	return s.answer(ctx, req, nil)
}

// answer is ShouldRateLimit, with a one-descriptor response in into's
// memory when into is given.
func (s *Server) answer(ctx context.Context, req *rlspb.RateLimitRequest, into *recycled) (*rlspb.RateLimitResponse, error) {
	if err := validate(req, s.maxReq); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	e := s.current()
	if err := refusedRefund(e.pol, req); err != nil {
		return nil, err
	}
	sc := getScratch(len(req.Descriptors))
	defer sc.release()
	if err := matchInto(e.match, req, sc); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	c := call{req: req, found: sc.found, shadowAll: e.shadowAll}
	c.groups = plan(req, sc.found, &sc.ds, &sc.plan)
	c.ds = sc.ds
	s.decide(ctx, &c, sc)
	return s.respond(&c, sc, e, into), nil
}

// current is the loaded policy in force (Options.Source). One call
// loads a policy the source has just answered, compiling its matcher;
// the calls that find it changed meanwhile wait for that one and use what
// it loaded. Each loading it again, every call in flight at a reload
// would compile the policy at once, the compile's CPU and memory times
// the calls (TestReloadLoadsOnce). Under the lock the source is asked
// again, so that a call that read an older policy does not load it over
// a newer one.
func (s *Server) current() *loaded {
	e := s.loaded.Load()
	if s.source == nil {
		return e
	}
	if p := s.source(); p == nil || p == e.pol {
		return e
	}
	s.loading.Lock()
	defer s.loading.Unlock()
	e = s.loaded.Load()
	if p := s.source(); p != nil && p != e.pol {
		e = s.setPolicy(p)
	}
	return e
}

// refusedRefund refuses a call that gives hits back (is_negative_hits)
// unless pol allows it: a refund from a caller refills any bucket it
// names, so only callers the operator trusts with that may send one. It
// is refused before any store call, so the call charges and refunds
// nothing.
func refusedRefund(pol *policy.Policy, req *rlspb.RateLimitRequest) error {
	if pol.Settings.AllowNegativeHits {
		return nil
	}
	for i, d := range req.Descriptors {
		if d.IsNegativeHits {
			return status.Errorf(codes.InvalidArgument, "descriptors[%d]: is_negative_hits (a refund) is refused: this server does not take refunds from callers (allow_negative_hits is false in its configuration)", i)
		}
	}
	return nil
}

// plan sorts the limits found for req into the groups decided together,
// each with its descriptor's cost: how each descriptor is decided in
// *dsBuf, the groups' matches in *msBuf, each grown when too small (and
// kept grown for the next call).
func plan(req *rlspb.RateLimitRequest, found []Found, dsBuf *[]descState, msBuf *[]policy.Match) (groups [3]group) {
	ds, ms := *dsBuf, *msBuf
	ds = slices.Grow(ds[:0], len(req.Descriptors))[:len(req.Descriptors)]
	// Each group's limits are contiguous: count them, then lay the groups
	// out one after another in ms.
	var counts [3]int
	for i, d := range req.Descriptors {
		st, f := &ds[i], &found[i]
		*st = descState{} // the last call's, when ds is reused
		st.kind, st.cost = costOf(req, d)
		if st.kind == kindTake && tooBig(f.Limits, st.cost) {
			// A cost no bucket of it can ever hold: over the limit without
			// asking the store, and answered with the bucket as it stands.
			st.kind, st.cost, st.tooBig = kindPeek, 1, true
		}
		counts[st.kind] += len(f.Limits)
	}
	ms = slices.Grow(ms[:0], counts[0]+counts[1]+counts[2])
	*dsBuf, *msBuf = ds, ms[:0]
	off := 0
	for k := range groups {
		groups[k].ms = ms[off : off : off+counts[k]]
		off += counts[k]
	}
	for i := range ds {
		st := &ds[i]
		k := st.kind
		st.first, st.n = len(groups[k].ms), len(found[i].Limits)
		for _, m := range found[i].Limits {
			ask(&m, st.cost)
			groups[k].ms = append(groups[k].ms, m)
		}
	}
	return groups
}

// decide asks the store. Peeks go first: a check without charging that
// fails a descriptor marks it over its limit before anything is charged.
// The call is refused when a descriptor that is not in quota mode is over
// its limit, or when every quota-mode descriptor of it is (the reference
// server's overall code); a refused call charges nothing. An admitted call
// charges every descriptor that is not over its limit, in one
// all-or-nothing take (see charge).
func (s *Server) decide(ctx context.Context, c *call, sc *scratch) {
	ctx, deadline := storeContext(ctx, s.lim.Store(), s.timeout)
	defer deadline.end()
	take, peek, refund := &c.groups[kindTake], &c.groups[kindPeek], &c.groups[kindRefund]
	peek.op, take.op, refund.op = engine.OpPeek, engine.OpTake, engine.OpRefund
	s.apply(ctx, peek, &sc.groups[kindPeek])
	for i := range c.ds {
		st, f := &c.ds[i], &c.found[i]
		if st.kind == kindPeek && peek.decided {
			st.rrs = peek.res.Results[st.first : st.first+st.n]
		}
		st.over = st.tooBig || (f.Blocked && !f.Shadow) || violated(st.rrs)
	}
	if c.refused() && !c.shadowAll {
		take.op = engine.OpPeek
		s.apply(ctx, take, &sc.groups[kindTake])
		c.results(take)
	} else {
		s.charge(ctx, c, &sc.groups[kindTake])
	}
	s.apply(ctx, refund, &sc.groups[kindRefund])
	c.results(refund)
	c.allowed = c.shadowAll || !c.refused()
}

// charge takes the descriptors of the take group together. A soft
// descriptor (quota mode, or any under SHADOW_MODE) over its limit does
// not stop the others from being charged: the take is asked again
// without it, so that it is left as it stands (not charged, as any
// descriptor over its limit) while the rest are. Each round leaves out at
// least one descriptor, so there are at most as many rounds as
// descriptors. A descriptor that is not soft and is over its limit, or
// every quota descriptor over, refuses the call: nothing is charged.
func (s *Server) charge(ctx context.Context, c *call, room *policy.Scratch) {
	take := &c.groups[kindTake]
	for {
		s.apply(ctx, take, room)
		c.results(take)
		if !take.decided || take.res.Allowed {
			return
		}
		left := false
		for i := range c.ds {
			st := &c.ds[i]
			if st.kind != kindTake || st.excluded || !violated(st.rrs) {
				continue
			}
			st.over = true
			if !c.found[i].Quota && !c.shadowAll {
				return // refused by a limit that is not soft
			}
			// Its results outlive the next round, which reuses room.
			st.rrs, st.excluded, left = slices.Clone(st.rrs), true, true
		}
		if !left || (!c.shadowAll && c.refused()) {
			return
		}
		// The next round: the descriptors still in, laid out anew.
		ms := make([]policy.Match, 0, len(take.ms))
		for i := range c.ds {
			st := &c.ds[i]
			if st.kind != kindTake || st.excluded {
				continue
			}
			first := len(ms)
			ms = append(ms, take.ms[st.first:st.first+st.n]...)
			st.first = first
		}
		take.ms, take.decided = ms, false
	}
}

// results sets the results of g's descriptors (those g decided, and not
// left out of it) and whether they charged their buckets (a refund's
// decisions describe the bucket after it, as a charge's do).
func (c *call) results(g *group) {
	if !g.decided {
		return
	}
	charged := g.op == engine.OpRefund || (g.op == engine.OpTake && g.res.Allowed)
	for i := range c.ds {
		st := &c.ds[i]
		if &c.groups[st.kind] != g || st.excluded {
			continue
		}
		st.rrs, st.charged = g.res.Results[st.first:st.first+st.n], charged
	}
}

// refused reports whether the call's overall code is OVER_LIMIT, as the
// reference server computes it: a descriptor that is not in quota mode is
// over its limit, or every quota-mode descriptor is (an unlimited
// descriptor, and a refund, is neither).
func (c *call) refused() bool {
	quota, quotaOver := 0, 0
	for i := range c.ds {
		st, f := &c.ds[i], &c.found[i]
		switch {
		case f.Unlimited || st.kind == kindRefund:
		case f.Quota:
			quota++
			if st.over {
				quotaOver++
			}
		case st.over:
			return true
		}
	}
	return quota > 0 && quota == quotaOver
}

// violated reports whether an enforce-mode limit of rrs rejected.
func violated(rrs []policy.Result) bool {
	for i := range rrs {
		if !rrs[i].Shadow && rrs[i].Violated {
			return true
		}
	}
	return false
}

// respond is the answer to a decided call: a status per descriptor, and
// the RateLimit headers of every enforce-mode limit of the call as its
// bucket stands afterwards.
func (s *Server) respond(c *call, sc *scratch, e *loaded, into *recycled) *rlspb.RateLimitResponse {
	now := &reading{s: s}
	resp, blocks, room := newResponse(len(c.ds), len(c.groups[kindTake].ms)+len(c.groups[kindPeek].ms) > 0, into)
	if !c.allowed {
		resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
	}
	parts := &sc.parts
	parts.Reset(c.allowed)
	for i := range c.ds {
		st, f := &c.ds[i], &sc.found[i]
		rrs, charged := st.rrs, st.charged
		resp.Statuses[i] = s.status(st, f, rrs, charged, &blocks[i], now, e)
		if st.kind == kindRefund {
			continue
		}
		// The waits are the statuses' duration_until_reset to the second
		// (a store failure's wait stands: it is no window's).
		added := parts.Add(rrs, charged, st.tooBig)
		for j := range added {
			rr := &added[j]
			rr.Decision.ResetAfter, rr.Decision.RetryAfter = resetOf(rr.Match.Request.Limit, rr.Decision, rr.Violated && rr.StoreErr == nil, now)
		}
		if f.Blocked && !f.Shadow {
			parts.AddBlocked(f.Limit.GetName(), resp.Statuses[i].DurationUntilReset.AsDuration())
		}
	}
	if parts.Limited() {
		identity := "" // only a rejection's Retry-After is jittered by it
		if !c.allowed {
			identity = identityOf(c.req)
		}
		var fs [policy.MaxFields]policy.Field
		resp.ResponseHeadersToAdd = headerValues(parts.AppendFields(fs[:0], identity, c.req.Domain, e.headers), room)
	}
	return resp
}

// identityOf seeds the Retry-After jitter: the first descriptor, which
// usually names the client (remote_address, an API key); validate saw
// that it has an entry.
func identityOf(req *rlspb.RateLimitRequest) string {
	en := req.Descriptors[0].Entries[0]
	return en.Key + "=" + en.Value
}

// apply decides one group, with its results and its store calls in
// room's memory.
func (s *Server) apply(ctx context.Context, g *group, room *policy.Scratch) {
	if len(g.ms) == 0 {
		return
	}
	g.res, g.decided = policy.Enforce(ctx, s.lim, g.ms, policy.Options{Op: g.op, Scratch: room, Observer: s.obs}), true
	for i := range g.res.Results {
		if rr := &g.res.Results[i]; rr.StoreErr != nil {
			s.storeLog.Log(s.log, rr.Match.Request.Limit.Name(), rr.Match.Request.Key, rr.StoreErr, !rr.Decision.Allowed)
		}
	}
}

// statusBlock holds one descriptor's status and its duration, so that a
// response allocates them together.
type statusBlock struct {
	status rlspb.RateLimitResponse_DescriptorStatus
	reset  durationpb.Duration
}

// durationOf is durationpb.New(d) written into p.
func durationOf(p *durationpb.Duration, d time.Duration) *durationpb.Duration {
	secs := d / time.Second
	p.Seconds, p.Nanos = int64(secs), int32(d-secs*time.Second)
	return p
}

// status is one descriptor's answer, written into b, under e's policy.
func (s *Server) status(st *descState, f *Found, rrs []policy.Result, charged bool, b *statusBlock, now *reading, e *loaded) *rlspb.RateLimitResponse_DescriptorStatus {
	out := &b.status
	out.Code = rlspb.RateLimitResponse_OK
	switch {
	case f.Unlimited:
		out.LimitRemaining = math.MaxUint32
		return out
	case f.Blocked:
		if !f.Shadow {
			out.Code = rlspb.RateLimitResponse_OVER_LIMIT
		}
		out.CurrentLimit = f.Limit
		out.DurationUntilReset = durationOf(&b.reset, ceilSecond(untilBoundary(now.get(), f.Window, 0)))
		return out
	case len(rrs) == 0:
		return out
	}
	// The rule that speaks for the descriptor: a rejecting one, else the one
	// closest to rejecting; enforce-mode rules before shadow ones.
	best, lim, over := policy.PartDecision(rrs, charged)
	if (over || st.tooBig) && st.kind != kindRefund {
		out.Code = rlspb.RateLimitResponse_OVER_LIMIT
	}
	if f.Limit != nil {
		out.CurrentLimit = f.Limit
	} else if lim != nil {
		out.CurrentLimit = s.limitOf(e, lim)
	}
	out.LimitRemaining = clampU32(best.Remaining)
	if out.Code == rlspb.RateLimitResponse_OVER_LIMIT {
		// Nothing is left for this request, whatever the bucket holds for a
		// smaller one: the reference server says 0, as RateLimit's r does.
		out.LimitRemaining = 0
	}
	reset, _ := resetOf(lim, best, false, now)
	out.DurationUntilReset = durationOf(&b.reset, reset)
	return out
}

// resetOf is duration_until_reset for a limit's decision d, in whole
// seconds as the reference server answers, and the wait before a
// rejected d is admitted, rounded to agree with it.
//
// A window with a fixed start (the reference format's, aligned to the
// epoch) resets at the end of the current window, whatever its count: the
// reference server answers unit - now%unit with now in whole Unix
// seconds, which is the time left in the window rounded up to a whole
// second, from 1 up to the whole unit. Every other limit resets when its
// bucket is full again: that time rounded up to a whole second (at least
// 1 when the bucket is not full, 0 when it is).
func resetOf(l *sluice.Limit, d sluice.Decision, rejected bool, now *reading) (reset, retry time.Duration) {
	retry = d.RetryAfter
	if l != nil {
		if p := l.Params(); p.Algorithm == engine.FixedWindow && p.Offset >= 0 {
			period := engine.Duration(p.Period)
			reset = ceilSecond(untilBoundary(now.get(), period, p.Offset))
			if rejected && retry <= period {
				// Tokens arrive at the boundary the status names; the store
				// measured it a moment earlier.
				retry = reset
			}
			return reset, retry
		}
	}
	return ceilSecond(d.ResetAfter), retry
}

// ceilSecond rounds d up to a whole second.
func ceilSecond(d time.Duration) time.Duration {
	return (max(d, 0) + time.Second - 1) / time.Second * time.Second
}

// reading is the Limiter's clock, read once for a response, and only if
// the response needs it (a window's boundary): a bucket's answer does not,
// and a clock read is a good part of a call's own cost on some hosts.
type reading struct {
	s    *Server
	t    time.Time
	done bool
}

func (r *reading) get() time.Time {
	if !r.done {
		r.t, r.done = r.s.lim.Now(), true // the clock decisions are dated by
	}
	return r.t
}

// limitOf is inferLimit, computed once per limit: with e for the
// policy's own limits, else on first use. The messages are shared by
// every response that reports the limit, which is safe because they are
// never changed after they are made: marshalling only reads them.
func (s *Server) limitOf(e *loaded, l *sluice.Limit) *rlspb.RateLimitResponse_RateLimit {
	if m, ok := e.limits[l]; ok {
		return m
	}
	if v, ok := s.limits.Load(l); ok {
		return v.(*rlspb.RateLimitResponse_RateLimit)
	}
	cl := inferLimit(l.Name(), l)
	s.limits.Store(l, cl)
	return cl
}

// untilBoundary is the time from now to the next window boundary of
// windows of period starting at offset microseconds past the epoch: more
// than 0, at most period.
func untilBoundary(now time.Time, period time.Duration, offset int64) time.Duration {
	p := engine.Micros(period)
	if p <= 0 {
		return 0
	}
	x := now.UnixMicro() - offset
	return engine.Duration(p - (x - engine.FloorDiv(x, p)*p))
}
