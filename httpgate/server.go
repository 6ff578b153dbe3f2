package httpgate

import (
	"context"
	"net"
	"net/http"
	"sync"
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
type ConnLimiter struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once

	mu   sync.Mutex
	idle map[*limitedConn]struct{}
	// want is set while a new connection waits for a place and no idle
	// one has been closed for it: the next to become idle is.
	want bool
}

// LimitConns caps ln at max connections held at once.
func LimitConns(ln net.Listener, max int) *ConnLimiter {
	return &ConnLimiter{Listener: ln, sem: make(chan struct{}, max), done: make(chan struct{}), idle: map[*limitedConn]struct{}{}}
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
		return &limitedConn{Conn: c, l: l}, nil
	default:
	}
	// net/http accepts on one goroutine per listener: one waits at most.
	l.mu.Lock()
	var victim *limitedConn
	for ic := range l.idle {
		victim = ic
		delete(l.idle, ic)
		break
	}
	l.want = victim == nil
	l.mu.Unlock()
	if victim != nil {
		victim.Close()
	}
	defer func() {
		l.mu.Lock()
		l.want = false
		l.mu.Unlock()
	}()
	select {
	case l.sem <- struct{}{}:
		return &limitedConn{Conn: c, l: l}, nil
	case <-l.done:
		c.Close()
		return nil, net.ErrClosed
	}
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
	l.mu.Lock()
	if s != http.StateIdle {
		delete(l.idle, lc)
		l.mu.Unlock()
		return
	}
	if l.want {
		l.want = false
		l.mu.Unlock()
		lc.Close()
		return
	}
	l.idle[lc] = struct{}{}
	l.mu.Unlock()
}

type limitedConn struct {
	net.Conn
	l    *ConnLimiter
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.idle, c)
		c.l.mu.Unlock()
		<-c.l.sem
	})
	return err
}
