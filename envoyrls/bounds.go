package envoyrls

import (
	"context"
	"fmt"
	"math"
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

// healthCheck is the health service's unary method: tiny, and answered
// even while the rate limit calls fill every place, so that Envoy's
// health checks tell a busy server from a dead one.
var healthCheck = "/" + healthpb.Health_ServiceDesc.ServiceName + "/Check"

// inFlight counts the calls of a server being decided, over all its
// connections.
type inFlight struct {
	sem chan struct{}
	// release gives a place back: one func for every call, rather than a
	// closure allocated per call.
	release func()
}

func newInFlight(n int) *inFlight {
	f := &inFlight{sem: make(chan struct{}, n)}
	f.release = func() { <-f.sem }
	return f
}

// admit is the server's InTapHandle: it takes a place for the call, given
// back when grpc-go ends the call's stream (which cancels its context,
// whether the call was answered, refused, cancelled or its connection
// lost), or refuses the call when none is free. It must not block:
// grpc-go calls it on the connection's reading goroutine.
func (f *inFlight) admit(ctx context.Context, info *tap.Info) (context.Context, error) {
	if info.FullMethodName == healthCheck {
		return ctx, nil
	}
	select {
	case f.sem <- struct{}{}:
		context.AfterFunc(ctx, f.release)
		return ctx, nil
	default:
		return ctx, status.Error(codes.ResourceExhausted, fmt.Sprintf("the rate limit service is deciding %d calls, its max_in_flight (grpc section): retry later", cap(f.sem)))
	}
}
