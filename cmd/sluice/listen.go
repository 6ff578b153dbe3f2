package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/policy"
)

// The HTTP listeners' deadlines and bounds (the policy's server section).
//
// The decision API and forward auth answer small requests at once, so
// their listener bounds each request as a whole: ReadTimeout covers the
// line, headers and body, WriteTimeout the answer (pushed back by a
// reservation's wait, see holdWrite). The reverse proxy streams bodies
// both ways for as long as they flow (uploads, event streams, websockets),
// so there read_timeout and write_timeout bound each wait for the client
// instead (streamDeadlines): a client that stalls is cut, one that keeps
// sending or reading is not.

// apiServer returns the http.Server of a decision API or forward auth
// listener.
func apiServer(h http.Handler, lim policy.ServerLimits, lc *connLimiter) *http.Server {
	return &http.Server{
		Handler:           holdWrite(h),
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		ReadTimeout:       lim.ReadTimeout,
		WriteTimeout:      lim.WriteTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ConnState:         lc.track,
	}
}

// proxyServer returns the http.Server of the reverse proxy listener.
func proxyServer(h http.Handler, lim policy.ServerLimits, lc *connLimiter) *http.Server {
	return &http.Server{
		Handler:           streamDeadlines(h, lim.ReadTimeout, lim.WriteTimeout),
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ConnState:         lc.track,
	}
}

type controllerKey struct{}

// holdWrite passes each request's ResponseController to the gate's Delay
// (reserveDelay) through its context.
func holdWrite(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), controllerKey{}, http.NewResponseController(w))
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// reserveDelay is the gate's Delay under serve: a request admitted on a
// reservation (leaky bucket shaping, reserve: true) is held until its turn,
// so its write deadline moves to writeTimeout after the turn; the server's
// WriteTimeout, counted from the request's arrival, would cut it.
func reserveDelay(writeTimeout time.Duration) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error {
		if rc, ok := ctx.Value(controllerKey{}).(*http.ResponseController); ok {
			rc.SetWriteDeadline(time.Now().Add(d + writeTimeout))
		}
		return httpgate.Wait(ctx, d)
	}
}

// streamDeadlines bounds each wait for the client on a proxied request:
// every read of the body must get bytes within readTimeout, every write of
// the response must be taken within writeTimeout. Time spent waiting for
// the upstream is not the client's and is not counted.
func streamDeadlines(h http.Handler, readTimeout, writeTimeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &idleReader{ReadCloser: r.Body, rc: rc, d: readTimeout}
		}
		sw := &idleWriter{ResponseWriter: w, rc: rc, d: writeTimeout}
		defer func() {
			// The server still writes after the handler (the end of a
			// chunked body): give it a deadline of its own, not a
			// stale one from the last write.
			if !sw.hijacked {
				rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			}
		}()
		h.ServeHTTP(sw, r)
	})
}

// idleReader sets the connection's read deadline before each read of a
// request body. Once the body ends, net/http clears it to watch for the
// client going away.
type idleReader struct {
	io.ReadCloser
	rc *http.ResponseController
	d  time.Duration
}

func (r *idleReader) Read(p []byte) (int, error) {
	r.rc.SetReadDeadline(time.Now().Add(r.d))
	return r.ReadCloser.Read(p)
}

// idleWriter sets the connection's write deadline before each write and
// flush of a response. Other controls (Hijack for websockets, deadlines)
// reach the server's writer through Unwrap.
type idleWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	d        time.Duration
	hijacked bool
}

func (w *idleWriter) Write(p []byte) (int, error) {
	w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.ResponseWriter.Write(p)
}

func (w *idleWriter) FlushError() error {
	w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.rc.Flush()
}

// Hijack hands the connection over (a websocket upgrade); net/http clears
// its deadlines, and the upgraded stream is the two ends' business.
func (w *idleWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := w.rc.Hijack()
	if err == nil {
		w.hijacked = true
	}
	return c, brw, err
}

func (w *idleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// connLimiter caps the connections a listener holds at once, so that
// clients holding connections open cannot take every file descriptor of
// the process. At the cap, a new connection is accepted from the kernel
// and waits for a place; an idle keep-alive connection, the one there is
// or the next to become idle, is closed to make that place (its client
// reconnects when it next needs to), so a pool of idle connections never
// locks new clients out. While one waits, later connections queue in the
// kernel's listen backlog, and every place held by a slow client frees
// within the read deadlines.
type connLimiter struct {
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

func limitConns(ln net.Listener, max int) *connLimiter {
	return &connLimiter{Listener: ln, sem: make(chan struct{}, max), done: make(chan struct{}), idle: map[*limitedConn]struct{}{}}
}

// Accept returns the next connection once the listener holds fewer than
// its cap.
func (l *connLimiter) Accept() (net.Conn, error) {
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
func (l *connLimiter) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// track is the server's ConnState hook: it knows which connections are
// idle between requests, and closes one that becomes idle while a new
// connection waits for its place. A request arriving on an idle
// connection at the moment it is closed is lost, as with
// http.Server.Shutdown's closing of idle connections; clients retry such
// requests on a new connection.
func (l *connLimiter) track(c net.Conn, s http.ConnState) {
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
	l    *connLimiter
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

// maxConns is each HTTP listener's connection cap: max_conns when set,
// else DefaultMaxConns lowered so that n listeners together use at most
// three quarters of the open file limit, leaving the rest to the store's
// connections, the gRPC listener and files.
func maxConns(set int, nofile uint64, n int) int {
	if set > 0 {
		return set
	}
	if n < 1 {
		n = 1
	}
	auto := uint64(policy.DefaultMaxConns)
	if nofile > 0 {
		auto = min(auto, nofile*3/4/uint64(n))
	}
	return int(max(auto, 16))
}

// openFileLimit is the process's soft limit on open files (0 if unknown).
// The Go runtime raises it to the hard limit at start.
func openFileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return rl.Cur
}
