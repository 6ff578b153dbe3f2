package adaptive

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"sync/atomic"
	"time"
)

// Measure serves r with next and returns how the upstream answered: the
// status, and the latency from when the request was fully sent (the
// transport's WroteRequest, or the wrapped handler's read of the body's
// end) to the first byte of the answer (the transport's
// GotFirstResponseByte, or the response's headers, which also follow an
// interim 1xx answer). So a client trickling its body, or drawing a 100
// Continue with its Expect header, is not a slow (or fast) upstream, and
// an event stream's length says nothing of the upstream's health. status
// is 0 when the client went away before any answer, or when reading the
// request's body failed (the client hung up mid-upload, or sent a body
// that is not HTTP): nothing is known of the upstream, whatever next
// answered, since a proxy's transport and many handlers answer a body
// they could not read with a 5xx of their own. now is the clock the
// times are read from.
func Measure(next http.Handler, w http.ResponseWriter, r *http.Request, now func() time.Time) (status int, latency time.Duration) {
	rec := &statusRecorder{ResponseWriter: w, now: now}
	lt := &latencyTrace{now: now, sent: now()}
	r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { lt.mark(&lt.sent) },
		GotFirstResponseByte: func() { lt.mark(&lt.first) },
		Got1xxResponse:       lt.interim,
	}))
	var body *bodyEnd
	if r.Body != nil && r.Body != http.NoBody {
		body = &bodyEnd{ReadCloser: r.Body, lt: lt}
		r.Body = body
	}
	next.ServeHTTP(rec, r)
	if body != nil && body.failed.Load() {
		return 0, 0
	}
	status, at := rec.status, rec.at
	if status == 0 && r.Context().Err() == nil {
		status, at = http.StatusOK, now() // net/http's implicit 200
	}
	return status, lt.latency(at)
}

// latencyTrace notes when a request was fully sent and when the first
// byte of its answer came; the transport's trace hooks and the body run
// on other goroutines.
type latencyTrace struct {
	now         func() time.Time
	mu          sync.Mutex
	sent, first time.Time
	// informational: the first byte was an interim answer (100 Continue,
	// which a client's Expect header makes the upstream send before it
	// has done anything), so the answer's time is its headers'.
	informational bool
}

// interim notes a 1xx answer (httptrace's Got1xxResponse).
func (l *latencyTrace) interim(int, textproto.MIMEHeader) error {
	l.mu.Lock()
	l.informational = true
	l.mu.Unlock()
	return nil
}

func (l *latencyTrace) mark(t *time.Time) {
	now := l.now()
	l.mu.Lock()
	if t == &l.sent {
		// The latest of the marks: the body's end, then the request's.
		if now.After(*t) {
			*t = now
		}
	} else if t.IsZero() {
		*t = now
	}
	l.mu.Unlock()
}

// latency is from the request's sending to its first byte, or headers
// (at) where no transport told the first byte; zero when the answer came
// before the request was all sent (an upstream refusing a body early).
func (l *latencyTrace) latency(headers time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.first
	if first.IsZero() || l.informational {
		first = headers
	}
	return max(first.Sub(l.sent), 0)
}

// bodyEnd marks when the handler has read the request's body to its end:
// the client's upload is over; or notes that reading it failed, which is
// the client's doing. The transport reads it on its own goroutine.
type bodyEnd struct {
	io.ReadCloser
	lt     *latencyTrace
	failed atomic.Bool
}

func (b *bodyEnd) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		b.lt.mark(&b.lt.sent)
	case ClientFailed(err):
		b.failed.Store(true)
	}
	return n, err
}

// ClientFailed reports whether err, from reading a request's body, is
// the client's failure: it hung up mid-upload, or sent a body that is not
// HTTP. io.EOF is the body's end, and a read after Close is the reader's
// doing: a transport that had the upstream's answer before it sent the
// whole body closes it, and that early answer (a 503 shedding load) is
// the upstream's.
func ClientFailed(err error) bool {
	return err != nil && err != io.EOF && !errors.Is(err, http.ErrBodyReadAfterClose)
}

// statusRecorder notes the status of a response and when its headers
// were written. It passes Flush, Hijack and Unwrap (http.ResponseController)
// through, so that event streams and websocket upgrades work through it.
type statusRecorder struct {
	http.ResponseWriter
	now    func() time.Time
	status int
	at     time.Time
}

// answered notes the status of the answer, the first one given.
func (s *statusRecorder) answered(code int) {
	if s.status == 0 {
		s.status, s.at = code, s.now()
	}
}

func (s *statusRecorder) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		s.answered(code)
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.answered(http.StatusOK)
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() {
	s.answered(http.StatusOK)
	http.NewResponseController(s.ResponseWriter).Flush()
}

func (s *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil {
		s.answered(http.StatusSwitchingProtocols)
	}
	return conn, brw, err
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
