package httpgate

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/policy"
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
func APIServer(h http.Handler, lim policy.ServerLimits, lc *ConnLimiter) *http.Server {
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

// ConnLimiter caps the connections a listener holds at once, so that
// clients holding connections open cannot take every file descriptor of
// the process. At the cap, a new connection is accepted from the kernel
// and waits for a place; an idle keep-alive connection, the one there is
// or the next to become idle, is closed to make that place (its client
// reconnects when it next needs to), so a pool of idle connections never
// locks new clients out. While one waits, later connections queue in the
// kernel's listen backlog, and every place held by a slow client frees
// within the read deadlines.
//
// The server serving it must report its connections' states to Track
// (http.Server.ConnState).
//
// Track runs twice per request (active, then idle), so it touches only
// the connection's own state and reads one shared flag: no lock, no
// shared map. The set of connections changes once per connection, and
// is searched for an idle one only when a new connection finds the cap
// reached.
type ConnLimiter struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once

	// want is set while a new connection waits for a place and no idle
	// one has been claimed for it: the next to become idle is.
	want atomic.Bool

	mu    sync.Mutex
	conns map[*limitedConn]struct{} // every connection holding a place
}

// LimitConns caps ln at max connections held at once.
func LimitConns(ln net.Listener, max int) *ConnLimiter {
	return &ConnLimiter{Listener: ln, sem: make(chan struct{}, max), done: make(chan struct{}), conns: map[*limitedConn]struct{}{}}
}

// Accept returns the next connection once the listener holds fewer than
// its cap.
func (l *ConnLimiter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	select {
	case l.sem <- struct{}{}:
		return l.hold(c), nil
	default:
	}
	// net/http accepts on one goroutine per listener: one waits at most.
	// want is set before the search, and Track sets a connection idle
	// before it reads want: of a connection turning idle now and this
	// search, at least one sees the other, so the place is never missed
	// (both may act, closing two idle connections, which costs their
	// clients a reconnection and nothing else).
	l.want.Store(true)
	defer l.want.Store(false)
	if victim := l.idleConn(); victim != nil {
		l.want.Store(false)
		victim.Close()
	}
	select {
	case l.sem <- struct{}{}:
		return l.hold(c), nil
	case <-l.done:
		c.Close()
		return nil, net.ErrClosed
	}
}

// hold wraps c, which has a place, and counts it among the connections.
func (l *ConnLimiter) hold(c net.Conn) *limitedConn {
	lc := &limitedConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[lc] = struct{}{}
	l.mu.Unlock()
	return lc
}

// idleConn claims an idle connection for closing, if there is one.
func (l *ConnLimiter) idleConn() *limitedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	for lc := range l.conns {
		if lc.state.CompareAndSwap(connIdle, connClaimed) {
			return lc
		}
	}
	return nil
}

// Close stops the listener and wakes an Accept waiting for a place.
func (l *ConnLimiter) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Track is the server's ConnState hook: it knows which connections are
// idle between requests, and closes one that becomes idle while a new
// connection waits for its place. A request arriving on an idle
// connection at the moment it is closed is lost, as with
// http.Server.Shutdown's closing of idle connections; clients retry such
// requests on a new connection.
func (l *ConnLimiter) Track(c net.Conn, s http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	if s != http.StateIdle {
		lc.state.Store(connBusy)
		return
	}
	lc.state.Store(connIdle)
	if l.want.Load() && l.want.CompareAndSwap(true, false) && lc.state.CompareAndSwap(connIdle, connClaimed) {
		lc.Close()
	}
}

// A connection's state, as Track last saw it.
const (
	connBusy    int32 = iota // new, serving a request, or no longer the server's
	connIdle                 // between requests
	connClaimed              // idle, and taken to be closed for a waiting connection
)

type limitedConn struct {
	net.Conn
	l     *ConnLimiter
	state atomic.Int32
	once  sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		<-c.l.sem
	})
	return err
}
