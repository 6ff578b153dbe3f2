package httpgate

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/internal/connlimit"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/serverconf"
)

// The server that sluice serve puts in front of forward auth and the
// decision API, here rather than in the command so that a benchmark (or
// a program of its own) can serve the gate exactly as sluice serve does.
//
// Those listeners answer small requests at once, so their server bounds
// each request as a whole: ReadTimeout covers the line, headers and
// body, WriteTimeout the answer (pushed back by a reservation's wait,
// see ReserveDelay).

// APIServer returns the http.Server of a decision API or forward auth
// listener serving h: the deadlines and bounds of lim, and lc's cap on
// connections (serve it on lc).
func APIServer(h http.Handler, lim serverconf.ServerLimits, lc *ConnLimiter) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		ReadTimeout:       lim.ReadTimeout,
		WriteTimeout:      lim.WriteTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ConnState:         lc.Track,
		// Marked, and its peer parsed, once per connection rather than
		// once per request: a reservation's wait is rare, a request is not.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(policy.WithPeer(ctx, c), apiServerKey{}, true)
		},
	}
}

// apiServerKey marks the context of a request that APIServer serves.
type apiServerKey struct{}

// heldKey carries the ResponseWriter of a request held for its turn to
// Options.Delay (see enforceHeld).
type heldKey struct{}

// withHeld returns ctx carrying w, the writer of the request that Delay
// holds.
func withHeld(ctx context.Context, w http.ResponseWriter) context.Context {
	return context.WithValue(ctx, heldKey{}, w)
}

// ReserveDelay is Options.Delay for a gate served by APIServer: a request
// admitted on a reservation (leaky bucket shaping, reserve: true) is held
// until its turn, so its write deadline moves to writeTimeout after the
// turn; the server's WriteTimeout, counted from the request's arrival,
// would cut it. A request another server serves (the reverse proxy's,
// which sets a deadline before each write itself) is left as it is.
func ReserveDelay(writeTimeout time.Duration) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error {
		if w, ok := ctx.Value(heldKey{}).(http.ResponseWriter); ok && ctx.Value(apiServerKey{}) != nil {
			http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d + writeTimeout))
		}
		return Wait(ctx, d)
	}
}

// ConnLimiter caps the connections a listener holds at once (see
// connlimit.Listener): at the cap a new connection waits for a place, and
// an idle keep-alive connection is closed to make one.
type ConnLimiter = connlimit.Listener

// LimitConns caps ln at max connections held at once.
func LimitConns(ln net.Listener, max int) *ConnLimiter { return connlimit.New(ln, max) }
