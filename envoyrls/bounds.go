package envoyrls

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/sluicehq/sluice/serverconf"
)

// LimitOptions are the gRPC server options that hold a server to g (the
// grpc section's bounds, defaults filled in) and to the HTTP listeners'
// handshake deadline and header bound (s's read_header_timeout and
// max_header_bytes), to be given to grpc.NewServer with ServerOptions.
//
// What a call can make the process hold is bounded before its message
// is read: a message over g.MaxRecvBytes is refused from its length
// prefix, and a call beyond g.MaxInFlight, counted over every
// connection, is refused when its headers arrive (InTapHandle), so its
// body is never buffered. g.MaxConcurrentStreams keeps one connection
// from taking every place. The connection cap (g.MaxConns) is the
// listener's: see sluice serve.
func LimitOptions(g serverconf.GRPCLimits, s serverconf.ServerLimits) []grpc.ServerOption {
	g, s = g.WithDefaults(), s.WithDefaults()
	f := newInFlight(g.MaxInFlight)
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(uint32(g.MaxConcurrentStreams)),
		grpc.MaxRecvMsgSize(g.MaxRecvBytes),
		grpc.MaxHeaderListSize(uint32(min(s.MaxHeaderBytes, math.MaxUint32))),
		grpc.ConnectionTimeout(s.ReadHeaderTimeout),
		grpc.InTapHandle(f.admit),
		// Fixed flow-control windows of HTTP/2's initial size. grpc-go
		// otherwise estimates each connection's bandwidth-delay product:
		// it pings the client after receiving data, again whenever the
		// ack returns, for as long as the connection carries calls
		// (Envoy's small messages never grow the window to the
		// estimate's limit, which stops it), a frame each way per round
		// trip of every busy connection; and a client that fills its
		// windows could have them grown to 16 MiB a stream, which the
		// server would take before reading. What a stream may have
		// buffered is then this window.
		grpc.InitialWindowSize(flowWindow),
		grpc.InitialConnWindowSize(flowWindow),
		// Envoy may ping a connection while it carries calls; a client
		// pinging an idle one, or too often, is closed (grpc-go's
		// too_many_pings), so that pings cannot keep a place or a
		// goroutine busy without calls.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: g.KeepaliveMinTime, PermitWithoutStream: false}),
		// The server pings a connection silent for two minutes and closes
		// it when no answer comes in 20 s: a peer that vanished without
		// closing gives its place back.
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: g.MaxConnectionIdle, Time: 2 * time.Minute, Timeout: 20 * time.Second}),
	}
}

// flowWindow is each stream's and connection's HTTP/2 flow-control
// window: HTTP/2's initial 65,535 bytes, the least grpc-go takes as a
// fixed window.
const flowWindow = 1<<16 - 1

// healthCheck is the health service's unary method: tiny, and answered
// even while the rate limit calls fill every place, so that Envoy's
// health checks tell a busy server from a dead one.
var healthCheck = "/" + healthpb.Health_ServiceDesc.ServiceName + "/Check"

// inFlight counts the calls of a server being decided, over all its
// connections: a call takes a place when its headers arrive (admit) and
// gives it back when its handler returns (leave). A place is found again
// from the call's context, which admit wraps, so that taking and giving
// back cost no allocation beyond that wrapper, and no goroutine: a
// context.AfterFunc per call would start one for every call as its
// stream ends (BenchmarkShouldRateLimitGRPC counts the allocations).
//
// A call that never reaches the handler (an unknown method, an encoding
// the server cannot read, a stream reset before its turn) never gives
// its place back itself. Such places are taken back by a sweep once their
// streams have ended (grpc-go cancels a stream's context when it ends,
// whatever the reason): a sweep runs when admit finds no place free, at
// most once per sweepEvery, so that a flood of refused calls cannot make
// the server scan its places for each of them.
type inFlight struct {
	free   chan int32
	places []atomic.Pointer[place]

	sweeping  sync.Mutex
	lastSweep time.Time // under sweeping
}

// sweepEvery is how often, at most, admit looks for the places of ended
// streams.
const sweepEvery = time.Millisecond

func newInFlight(n int) *inFlight {
	f := &inFlight{free: make(chan int32, n), places: make([]atomic.Pointer[place], n)}
	for i := range n {
		f.free <- int32(i)
	}
	return f
}

// place is a call's context while it holds place i of f.
type place struct {
	context.Context
	f *inFlight
	i int32
}

// placeKey is the context key under which a place finds itself.
type placeKey struct{}

func (p *place) Value(key any) any {
	if key == (placeKey{}) {
		return p
	}
	return p.Context.Value(key)
}

// admit is the server's InTapHandle: it takes a place for the call, or
// refuses the call when none is free. It must not block: grpc-go calls
// it on the connection's reading goroutine.
func (f *inFlight) admit(ctx context.Context, info *tap.Info) (context.Context, error) {
	if info.FullMethodName == healthCheck {
		return ctx, nil
	}
	i, ok := f.take()
	if !ok {
		return ctx, status.Error(codes.ResourceExhausted, fmt.Sprintf("the rate limit service is deciding %d calls, its max_in_flight (grpc section): retry later", cap(f.free)))
	}
	p := &place{Context: ctx, f: f, i: i}
	f.places[i].Store(p)
	return p, nil
}

// take is a free place, after a sweep when none is.
func (f *inFlight) take() (int32, bool) {
	for swept := false; ; swept = true {
		select {
		case i := <-f.free:
			return i, true
		default:
		}
		if swept || !f.sweep() {
			return 0, false
		}
	}
}

// sweep gives back the places held by calls whose streams have ended,
// and says whether it found any. A call still running with its stream
// ended (its client went away) loses its place here, as it would when
// the stream's end gave it back: its leave then finds the place gone.
func (f *inFlight) sweep() bool {
	if !f.sweeping.TryLock() {
		return false
	}
	defer f.sweeping.Unlock()
	now := time.Now()
	if now.Sub(f.lastSweep) < sweepEvery {
		return false
	}
	f.lastSweep = now
	found := false
	for i := range f.places {
		p := f.places[i].Load()
		if p != nil && p.Context.Err() != nil && f.places[i].CompareAndSwap(p, nil) {
			f.free <- int32(i)
			found = true
		}
	}
	return found
}

// leave gives back the place that the call of ctx holds, if it still
// holds one (none when the server has no LimitOptions).
func leave(ctx context.Context) {
	p, ok := ctx.Value(placeKey{}).(*place)
	if ok && p.f.places[p.i].CompareAndSwap(p, nil) {
		p.f.free <- p.i
	}
}
