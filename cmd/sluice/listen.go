package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/serverconf"
)

// The HTTP listeners' deadlines and bounds (the policy's server section).
//
// The decision API and forward auth are served by httpgate.APIServer,
// which bounds each request as a whole. The reverse proxy streams bodies
// both ways for as long as they flow (uploads, event streams, websockets),
// so there read_timeout and write_timeout bound each wait for the client
// instead (streamDeadlines): a client that stalls is cut, one that keeps
// sending or reading is not.

// proxyServer returns the http.Server of the reverse proxy listener.
func proxyServer(h http.Handler, lim serverconf.ServerLimits, lc *httpgate.ConnLimiter) *http.Server {
	return &http.Server{
		Handler:           streamDeadlines(h, lim.ReadTimeout, lim.WriteTimeout),
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ConnState:         lc.Track,
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

// maxConns is each HTTP listener's connection cap: max_conns when set,
// else DefaultMaxConns lowered so that n listeners together use at most
// three quarters of the open file limit, leaving the rest to the store's
// connections, the gRPC listener and files.
func maxConns(set int, nofile uint64, n int) int {
	return connCap(set, serverconf.DefaultMaxConns, nofile, 3, 4*uint64(max(n, 1)))
}

// connCap is a listener's connection cap: set when given, else def
// lowered to num/den of the open file limit nofile (0: unknown), and 16
// at least.
func connCap(set, def int, nofile, num, den uint64) int {
	if set > 0 {
		return set
	}
	auto := uint64(def)
	if nofile > 0 {
		auto = min(auto, nofile*num/den)
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
