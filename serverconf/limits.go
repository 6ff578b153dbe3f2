package serverconf

import (
	"cmp"
	"time"
)

// ServerLimits are the deadlines and bounds of sluice serve's HTTP
// listeners: they decide how long a slow or silent client may hold a
// connection, and how many connections a listener holds at once.
type ServerLimits struct {
	// ReadHeaderTimeout bounds the wait for a request's line and headers.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, headers and body, on the
	// decision API and forward auth listener; on the reverse proxy, whose
	// bodies stream to the upstream, it bounds each wait for body bytes.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response on the decision API and
	// forward auth listener (pushed back by a reservation's wait); on the
	// reverse proxy, each write of a streamed response.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's line and headers.
	MaxHeaderBytes int
	// MaxConns bounds the connections each listener holds at once; 0
	// means automatic (DefaultMaxConns, lowered to fit the process's
	// open file limit).
	MaxConns int
	// MaxConnsPerClient bounds the connections one client (an address
	// outside trusted_proxies, an IPv6 one by its ipv6_prefix) holds or
	// waits with on a listener, so that one host cannot take every place;
	// 0 means a quarter of MaxConns, at most DefaultMaxConnsPerClient.
	MaxConnsPerClient int
	// ShutdownDrain is how long sluice serve, told to stop, keeps serving
	// while /readyz answers 503, before its listeners stop accepting: the
	// time a load balancer or a Kubernetes endpoint update needs to see it
	// unready and send new connections elsewhere. Zero stops at once;
	// WithDefaults leaves it as it is, so zero is a choice, not a gap.
	ShutdownDrain time.Duration
}

// DefaultServerLimits are the server section's defaults.
var DefaultServerLimits = ServerLimits{
	ReadHeaderTimeout: 10 * time.Second,
	ReadTimeout:       30 * time.Second,
	WriteTimeout:      30 * time.Second,
	IdleTimeout:       2 * time.Minute,
	MaxHeaderBytes:    64 << 10,
	ShutdownDrain:     5 * time.Second,
}

// DefaultMaxConns is the per-listener connection cap when max_conns is
// not set and the open file limit allows it.
const DefaultMaxConns = 10000

// DefaultMaxConnsPerClient is the most a client holds of a listener's
// connections when max_conns_per_client is not set.
const DefaultMaxConnsPerClient = 256

// ConnsPerClient is the most connections one client holds of a listener
// that holds conns: MaxConnsPerClient, or by default a quarter of conns,
// at most DefaultMaxConnsPerClient.
func (s ServerLimits) ConnsPerClient(conns int) int {
	return cmp.Or(s.MaxConnsPerClient, min(DefaultMaxConnsPerClient, max(conns/4, 1)))
}

// WithDefaults fills the limits left zero with DefaultServerLimits.
func (s ServerLimits) WithDefaults() ServerLimits {
	d := DefaultServerLimits
	orDefault(&s.ReadHeaderTimeout, d.ReadHeaderTimeout)
	orDefault(&s.ReadTimeout, d.ReadTimeout)
	orDefault(&s.WriteTimeout, d.WriteTimeout)
	orDefault(&s.IdleTimeout, d.IdleTimeout)
	orDefault(&s.MaxHeaderBytes, d.MaxHeaderBytes)
	return s
}

// orDefault sets a limit left unset (zero, or negative) to its default.
func orDefault[T int | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// MaxShutdownDrain bounds server.shutdown_drain: a process told to stop
// must stop within a bound an orchestrator can wait for.
const MaxShutdownDrain = 10 * time.Minute

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
	orDefault(&g.MaxConcurrentStreams, d.MaxConcurrentStreams)
	orDefault(&g.MaxRecvBytes, d.MaxRecvBytes)
	orDefault(&g.MaxInFlight, d.MaxInFlight)
	orDefault(&g.KeepaliveMinTime, d.KeepaliveMinTime)
	orDefault(&g.MaxConnectionIdle, d.MaxConnectionIdle)
	return g
}
