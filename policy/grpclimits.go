package policy

import (
	"time"

	"gopkg.in/yaml.v3"
)

// GRPCLimits are the bounds of sluice serve's Envoy rate limit service
// listener (grpc_listen), the grpc section. Together they bound the
// memory the listener can be made to hold: at most MaxInFlight calls are
// decided at once, each at most MaxRecvBytes on the wire, so a flood of
// calls, on one connection or many, waits or is refused rather than
// growing the process.
type GRPCLimits struct {
	// MaxConns bounds the connections the listener holds at once; 0
	// means automatic (DefaultGRPCMaxConns, lowered to fit the process's
	// open file limit). At the cap a new connection waits for one to
	// close.
	MaxConns int
	// MaxConcurrentStreams bounds the calls one connection carries at
	// once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): a client past it
	// waits, and one that ignores it has the extra streams refused.
	MaxConcurrentStreams int
	// MaxRecvBytes bounds one call's message: a larger one is refused
	// (ResourceExhausted) before it is read into memory. It is also the
	// bound on a call's descriptors' bytes in total.
	MaxRecvBytes int
	// MaxInFlight bounds the calls of the whole listener decided at once:
	// one more is refused at once (ResourceExhausted; Envoy then applies
	// its failure_mode_deny) before its message is read.
	MaxInFlight int
	// KeepaliveMinTime is the shortest interval between a client's
	// keepalive pings that the server tolerates; pings more often, or
	// on a connection without calls, close the connection.
	KeepaliveMinTime time.Duration
	// MaxConnectionIdle closes a connection that carried no call for
	// that long.
	MaxConnectionIdle time.Duration
}

// DefaultGRPCLimits are the grpc section's defaults. A real Envoy's call
// is a few descriptors of a few short entries, well under a kilobyte:
// MaxRecvBytes leaves it two orders of magnitude of room, and MaxInFlight
// calls of that size together stay within a few hundred megabytes.
var DefaultGRPCLimits = GRPCLimits{
	MaxConcurrentStreams: 100,
	MaxRecvBytes:         256 << 10,
	MaxInFlight:          256,
	KeepaliveMinTime:     5 * time.Second,
	MaxConnectionIdle:    15 * time.Minute,
}

// DefaultGRPCMaxConns is the gRPC listener's connection cap when the
// grpc section's max_conns is not set and the open file limit allows it:
// Envoy holds a few connections per worker thread, so a fleet of proxies
// needs hundreds, not the HTTP listeners' thousands.
const DefaultGRPCMaxConns = 1024

// WithDefaults fills the limits left zero with DefaultGRPCLimits (a
// policy built in code).
func (g GRPCLimits) WithDefaults() GRPCLimits {
	d := DefaultGRPCLimits
	if g.MaxConcurrentStreams <= 0 {
		g.MaxConcurrentStreams = d.MaxConcurrentStreams
	}
	if g.MaxRecvBytes <= 0 {
		g.MaxRecvBytes = d.MaxRecvBytes
	}
	if g.MaxInFlight <= 0 {
		g.MaxInFlight = d.MaxInFlight
	}
	if g.KeepaliveMinTime <= 0 {
		g.KeepaliveMinTime = d.KeepaliveMinTime
	}
	if g.MaxConnectionIdle <= 0 {
		g.MaxConnectionIdle = d.MaxConnectionIdle
	}
	return g
}

var grpcFields = []string{"max_conns", "max_concurrent_streams", "max_recv_bytes", "max_in_flight", "keepalive_min_time", "max_connection_idle"}

// grpcLimits reads the grpc section into g, which holds the defaults.
func (l *loader) grpcLimits(n *yaml.Node, g *GRPCLimits) {
	o := l.object(n, "grpc", grpcFields)
	if o == nil {
		return
	}
	for _, f := range []struct {
		name     string
		dst      *int
		min, max int
	}{
		{"max_conns", &g.MaxConns, 1, 1 << 20},
		{"max_concurrent_streams", &g.MaxConcurrentStreams, 1, 10000},
		// grpc-go's own default is the top: beyond it a call is no Envoy's.
		{"max_recv_bytes", &g.MaxRecvBytes, 4 << 10, 4 << 20},
		{"max_in_flight", &g.MaxInFlight, 1, 1 << 20},
	} {
		if v, vn, ok := o.integer(f.name); ok {
			if v < f.min || v > f.max {
				l.errf(vn, "grpc."+f.name, "must be between %d and %d (got %d)", f.min, f.max, v)
			} else {
				*f.dst = v
			}
		}
	}
	for _, f := range []struct {
		name string
		dst  *time.Duration
	}{
		{"keepalive_min_time", &g.KeepaliveMinTime},
		{"max_connection_idle", &g.MaxConnectionIdle},
	} {
		d, dn, ok := o.duration(f.name)
		switch {
		case !ok:
		case d <= 0:
			l.errf(dn, "grpc."+f.name, "must be > 0 (got %q)", dn.Value)
		default:
			*f.dst = d
		}
	}
}
