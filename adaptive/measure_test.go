package adaptive_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

// clock is a clock that moves only when told.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                   { return &clock{t: time.Unix(1_700_000_000, 0)} }
func request(body string) *http.Request {
	return httptest.NewRequest("POST", "/", strings.NewReader(body))
}
func measure(c *clock, h http.HandlerFunc, r *http.Request) (int, time.Duration) {
	return adaptive.Measure(h, httptest.NewRecorder(), r, c.now)
}

// The status measured is the answer's first: net/http's implicit 200 for
// a handler that writes nothing, and nothing (0) when the client left
// before any answer, which says nothing of the upstream.
func TestMeasureStatus(t *testing.T) {
	c := newClock()
	for name, tc := range map[string]struct {
		h    http.HandlerFunc
		want int
	}{
		"error":    {func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503); w.WriteHeader(200) }, 503},
		"write":    {func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "x") }, 200},
		"flush":    {func(w http.ResponseWriter, _ *http.Request) { w.(http.Flusher).Flush(); w.WriteHeader(500) }, 200},
		"implicit": {func(http.ResponseWriter, *http.Request) {}, 200},
	} {
		if got, _ := measure(c, tc.h, request("")); got != tc.want {
			t.Errorf("%s: status %d, want %d", name, got, tc.want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got, _ := measure(c, func(http.ResponseWriter, *http.Request) {}, request("").WithContext(ctx)); got != 0 {
		t.Errorf("a client gone before any answer measured status %d, want 0", got)
	}
}

// Attack: a client hangs up mid-upload to a handler (or a proxy's
// transport) that answers the body it could not read with a 5xx of its
// own, which counted against the upstream. A failed upload is measured
// as nothing (0); a read after the handler closed the body is the
// handler's own doing, and its answer (an upstream shedding load before
// reading the body) counts.
func TestAttackMeasureFailedUploadIsNotUpstreamError(t *testing.T) {
	c := newClock()
	cut := request("")
	cut.Body = io.NopCloser(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(io.ErrUnexpectedEOF)))
	if got, _ := measure(c, func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			w.WriteHeader(http.StatusBadGateway)
		}
	}, cut); got != 0 {
		t.Errorf("a failed upload measured status %d, want 0", got)
	}
	if got, _ := measure(c, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		r.Body.Close()
		r.Body.Read(make([]byte, 1))
	}, httptest.NewRequest("POST", "/", &closable{Reader: strings.NewReader("abc")})); got != http.StatusServiceUnavailable {
		t.Errorf("an early answer, the body read after close: status %d, want 503", got)
	}
}

// closable is a body that, as net/http's, fails a Read after Close.
type closable struct {
	io.Reader
	closed bool
}

func (c *closable) Read(p []byte) (int, error) {
	if c.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return c.Reader.Read(p)
}

func (c *closable) Close() error { c.closed = true; return nil }

// Attack: a client trickles its request body, so that the upstream seems
// slow and the adaptive rate of every client falls. The latency is
// measured from the body's end, not the request's start.
func TestAttackMeasureSlowBodyIsNotSlowUpstream(t *testing.T) {
	c := newClock()
	status, latency := measure(c, func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 1)
		for {
			c.advance(time.Second) // the client sends a byte a second
			if _, err := r.Body.Read(b); err != nil {
				break
			}
		}
		c.advance(20 * time.Millisecond) // the upstream's own time
		w.WriteHeader(200)
	}, request("0123456789"))
	if status != 200 || latency != 20*time.Millisecond {
		t.Errorf("measured %d after %v, want 200 after 20ms: the client's upload counted as the upstream's latency", status, latency)
	}
}

// Attack: a client sends "Expect: 100-continue", so that the upstream's
// interim 100 answer, sent before it does anything, is its first byte and
// a slow upstream seems fast. The time of an answer with an interim one
// is its headers'.
func TestAttackMeasureExpectContinueIsNotAFastAnswer(t *testing.T) {
	c := newClock()
	_, latency := measure(c, func(w http.ResponseWriter, r *http.Request) {
		// What a transport reports of an upstream that answers 100
		// Continue at once and its headers two seconds later.
		tr := httptrace.ContextClientTrace(r.Context())
		tr.WroteRequest(httptrace.WroteRequestInfo{})
		c.advance(time.Millisecond)
		tr.Got1xxResponse(http.StatusContinue, nil)
		tr.GotFirstResponseByte()
		c.advance(2 * time.Second)
		w.WriteHeader(200)
	}, request(""))
	if latency != 2001*time.Millisecond {
		t.Errorf("latency %v, want 2.001s: the interim answer was taken for the upstream's", latency)
	}
	_, latency = measure(c, func(w http.ResponseWriter, r *http.Request) {
		tr := httptrace.ContextClientTrace(r.Context())
		tr.WroteRequest(httptrace.WroteRequestInfo{})
		c.advance(30 * time.Millisecond)
		tr.GotFirstResponseByte()
		c.advance(time.Second) // the handler's own copying, not the upstream's
		w.WriteHeader(200)
	}, request(""))
	if latency != 30*time.Millisecond {
		t.Errorf("latency %v, want 30ms: the transport's first byte", latency)
	}
}
