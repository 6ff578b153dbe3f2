// Package connlimit caps the connections a listener holds at once. It is
// shared by the transports of sluice serve (the HTTP listeners and the
// Envoy gRPC listener), which must not import each other.
package connlimit

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// Listener caps the connections a listener holds at once, so that
// clients holding connections open cannot take every file descriptor of
// the process. At the cap, a new connection is accepted from the kernel
// and waits for a place; an idle keep-alive connection, the one there is
// or the next to become idle, is closed to make that place (its client
// reconnects when it next needs to), so a pool of idle connections never
// locks new clients out. While one waits, later connections queue in the
// kernel's listen backlog, and every place held by a slow client frees
// within the read deadlines.
//
// An HTTP server serving it must report its connections' states to Track
// (http.Server.ConnState). A server that does not (gRPC, whose HTTP/2
// connections carry many calls and are closed by its own idle timer)
// leaves every connection busy: at the cap a new connection waits until
// one closes.
//
// Track runs twice per request (active, then idle), so it touches only
// the connection's own state and reads one shared flag: no lock, no
// shared map. The set of connections changes once per connection, and
// is searched for an idle one only when a new connection finds the cap
// reached.
type Listener struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once

	// want is set while a new connection waits for a place and no idle
	// one has been claimed for it: the next to become idle is.
	want atomic.Bool

	mu      sync.Mutex
	conns   map[*limitedConn]struct{} // every connection holding a place
	clients map[string]int            // connections held or waiting, by client

	perClient int
	clientOf  func(net.Addr) string
}

// New caps ln at max connections held at once.
func New(ln net.Listener, max int) *Listener {
	return &Listener{Listener: ln, sem: make(chan struct{}, max), done: make(chan struct{}), conns: map[*limitedConn]struct{}{}, clients: map[string]int{}}
}

// PerClient caps each client at n connections, held or waiting, so that
// one client cannot take every place; one more is closed at once. clientOf
// names a connection's client by its peer address, "" for one not capped
// (a trusted proxy, whose connections carry every client's requests).
func (l *Listener) PerClient(n int, clientOf func(net.Addr) string) {
	l.perClient, l.clientOf = n, clientOf
}

// Accept returns the next connection once the listener holds fewer than
// its cap.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	for ; err == nil; c, err = l.Listener.Accept() {
		if lc := l.admit(c); lc != nil {
			return l.place(lc)
		}
		c.Close()
	}
	return nil, err
}

// admit counts c against its client's cap, nil when the client has no
// connection left.
func (l *Listener) admit(c net.Conn) *limitedConn {
	lc := &limitedConn{Conn: c, l: l}
	if l.clientOf != nil {
		lc.client = l.clientOf(c.RemoteAddr())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.client != "" && l.clients[lc.client] >= l.perClient {
		return nil
	}
	l.clients[lc.client]++
	return lc
}

// place waits for a place for c.
func (l *Listener) place(c *limitedConn) (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
		return l.hold(c), nil
	default:
	}
	// net/http and grpc-go accept on one goroutine per listener: one waits
	// at most.
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
		c.release()
		c.Conn.Close()
		return nil, net.ErrClosed
	}
}

// hold counts c, which has a place, among the connections.
func (l *Listener) hold(c *limitedConn) *limitedConn {
	l.mu.Lock()
	l.conns[c] = struct{}{}
	l.mu.Unlock()
	return c
}

// idleConn claims an idle connection for closing, if there is one.
func (l *Listener) idleConn() *limitedConn {
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
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Track is the server's ConnState hook: it knows which connections are
// idle between requests, and closes one that becomes idle while a new
// connection waits for its place. A request arriving on an idle
// connection at the moment it is closed is lost, as with
// http.Server.Shutdown's closing of idle connections; clients retry such
// requests on a new connection.
func (l *Listener) Track(c net.Conn, s http.ConnState) {
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
	l      *Listener
	client string // "" when not capped per client, all counted as one
	state  atomic.Int32
	once   sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.release()
		<-c.l.sem
	})
	return err
}

// release uncounts c, among the connections and its client's.
func (c *limitedConn) release() {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	if c.l.clients[c.client]--; c.l.clients[c.client] == 0 {
		delete(c.l.clients, c.client)
	}
	c.l.mu.Unlock()
}
