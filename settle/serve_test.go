package settle_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/settle"
)

func mustParse(t *testing.T, v string) *settle.Source {
	t.Helper()
	s, err := settle.Parse(v)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serve serves a request with h through settle.Serve, reading s, and
// returns the actual cost read, why it is not to be used, and the
// response the client got; aborted is whether Serve passed h's panic on.
func serve(t *testing.T, s *settle.Source, h http.HandlerFunc) (actual float64, why string, w *httptest.ResponseRecorder, aborted bool) {
	t.Helper()
	w = httptest.NewRecorder()
	defer func() { aborted = recover() != nil }()
	settle.Serve(h, w, httptest.NewRequest("POST", "/", nil), []*settle.Source{s}, nil, func(rec *settle.Recorder) {
		actual, why = rec.Actual(0)
	})
	return actual, why, w, false
}

func gzipped(s string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	io.WriteString(zw, s)
	zw.Close()
	return b.Bytes()
}

// A response states its cost in a header, a trailer (announced, or set
// with http.TrailerPrefix), its JSON body (gzip or not) or its event
// stream's last event that has one.
func TestServeReads(t *testing.T) {
	body := mustParse(t, "body:usage.total_tokens")
	for name, c := range map[string]struct {
		s    *settle.Source
		h    http.HandlerFunc
		want float64
	}{
		"header": {mustParse(t, "header:x-cost"), func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Add("X-Cost", "4")
			w.Header().Add("X-Cost", "9") // given twice: the larger
			io.WriteString(w, "ok")
		}, 9},
		"announced trailer": {mustParse(t, "trailer:x-cost"), func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Trailer", "X-Cost")
			io.WriteString(w, "ok")
			w.Header().Set("X-Cost", "7")
		}, 7},
		"prefixed trailer": {mustParse(t, "trailer:x-cost"), func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "ok")
			w.Header().Set(http.TrailerPrefix+"x-cost", "6")
		}, 6},
		"json": {body, func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, `{"usage":`)
			io.WriteString(w, `{"total_tokens":12}}`)
		}, 12},
		"gzip": {body, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(gzipped(`{"usage":{"total_tokens":13}}`))
		}, 13},
		"stream": {body, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"usage\":{\"total_tokens\":1}}\r\n\r\ndata: {\"usage\":")
			io.WriteString(w, "\ndata: {\"total_tokens\":14}}\n\ndata: [DONE]\n\n")
		}, 14},
		"stream fields": {body, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
			io.WriteString(w, "event: usage\ndata:{\"usage\":\ndatabase: {\"usage\":{\"total_tokens\":99}}\ndata\ndata:  {\"total_tokens\":15}}\n\n")
		}, 15},
	} {
		got, why, _, _ := serve(t, c.s, c.h)
		if got != c.want || why != "" {
			t.Errorf("%s: read %v (%q), want %v", name, got, why, c.want)
		}
	}
}

// Attack: the client makes the response state no usable cost: a stream
// without usage, an encoding that is not read, an error status whose body
// echoes what it sent, a connection dropped before the last event. None
// is used: the door then charges unsettled_cost.
func TestAttackServeUnusableCost(t *testing.T) {
	body := mustParse(t, "body:usage.total_tokens")
	for name, c := range map[string]struct {
		h   http.HandlerFunc
		why string
	}{
		"stream without usage": {func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
		}, "no cost stated"},
		"deflate": {func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Encoding", "deflate")
			io.WriteString(w, `{"usage":{"total_tokens":1}}`)
		}, "no cost stated"},
		"gzip stream": {func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(gzipped("data: {\"usage\":{\"total_tokens\":1}}\n\n"))
		}, "no cost stated"},
		"error status": {func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(400)
			io.WriteString(w, `{"usage":{"total_tokens":0}}`)
		}, "error status"},
		"cut short": {func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"usage\":{\"total_tokens\":1}}\n\n")
			panic(http.ErrAbortHandler)
		}, "cut short"},
	} {
		_, why, _, aborted := serve(t, body, c.h)
		if why != c.why || aborted != (c.why == "cut short") {
			t.Errorf("%s: %q (the panic passed on: %v), want %q", name, why, aborted, c.why)
		}
	}
}

// A stream's event too large to hold, or a JSON response too large, is
// not read for its cost (nor is an earlier event's, which the skipped one
// may have updated), and the response passes whole.
func TestServeBounds(t *testing.T) {
	big := strings.Repeat("y", 70<<10)
	for name, c := range map[string]struct {
		ctype, body string
		want        float64 // -1: none
	}{
		"event": {"text/event-stream", fmt.Sprintf("data: {\"usage\":{\"total_tokens\":3},\"pad\":\"%s\"}\n\n", big), -1},
		"line":  {"text/event-stream", fmt.Sprintf("data: {\"usage\":{\"total_tokens\":3}}\n\ndata: {\"pad\":\"%s\",\"usage\":{\"total_tokens\":5}}\n\n", big), -1},
		"json":  {"application/json", fmt.Sprintf("{\"pad\":\"%s\",\"usage\":{\"total_tokens\":3}}", strings.Repeat(big, 16)), -1},
	} {
		got, why, w, _ := serve(t, mustParse(t, "body:usage.total_tokens"), func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", c.ctype)
			io.WriteString(w, c.body)
		})
		if w.Body.String() != c.body {
			t.Errorf("%s: the response did not pass whole", name)
		}
		if (c.want < 0) != (why != "") || (c.want >= 0 && got != c.want) {
			t.Errorf("%s: read %v (%q), want %v", name, got, why, c.want)
		}
	}
}

// A body read for its cost is put back whole; a body longer than the
// limit, or one that does not fit the memory left, is not returned, and
// its memory is given back.
func TestReadBody(t *testing.T) {
	mem := settle.NewBodyMemory(100, 100)
	r := httptest.NewRequest("POST", "/", strings.NewReader(`{"n":1}`))
	got, release := settle.ReadBody(r, 10, mem, "a")
	if rest, _ := io.ReadAll(r.Body); string(got) != `{"n":1}` || string(rest) != `{"n":1}` {
		t.Errorf("read %q, the handler read %q", got, rest)
	}
	release()
	release()                                                                                      // a second call gives back nothing more
	r = httptest.NewRequest("POST", "/", io.NopCloser(strings.NewReader(strings.Repeat("x", 11)))) // no length declared
	got, release = settle.ReadBody(r, 10, mem, "a")
	if rest, _ := io.ReadAll(r.Body); got != nil || len(rest) != 11 {
		t.Errorf("a body past the limit: read %q, the handler read %d bytes", got, len(rest))
	}
	release()
	// All 100 bytes were given back: 99 of them fit at once, and then
	// not one more.
	big := httptest.NewRequest("POST", "/", strings.NewReader(strings.Repeat(" ", 98)))
	if got, _ := settle.ReadBody(big, 200, mem, "a"); len(got) != 98 {
		t.Fatalf("with the memory given back: read %d bytes, want 98", len(got))
	}
	r = httptest.NewRequest("POST", "/", strings.NewReader(`{"n":1}`))
	if got, _ := settle.ReadBody(r, 10, mem, "b"); got != nil {
		t.Errorf("with the memory spent: read %q", got)
	}
}

// Each client holds at most its share of the memory: a body that would
// take it beyond is not read, whatever is left in all, while another
// client's is; the share comes back with the bodies' release. A request
// with no client known is bounded by the total alone.
func TestReadBodyPerClient(t *testing.T) {
	mem := settle.NewBodyMemory(100, 40)
	read := func(client string, n int) ([]byte, func()) {
		return settle.ReadBody(httptest.NewRequest("POST", "/", strings.NewReader(strings.Repeat(" ", n))), 1000, mem, client)
	}
	got, releaseA := read("a", 39) // 40 bytes: a's whole share
	if len(got) != 39 {
		t.Fatalf("within the share: read %d bytes", len(got))
	}
	if got, release := read("a", 1); got != nil {
		t.Errorf("beyond the share: read %q", got)
		release()
	}
	if got, _ := read("b", 39); len(got) != 39 {
		t.Errorf("another client: read %d bytes, want 39", len(got))
	}
	// 20 bytes left in all: the unknown client gets them, past any share.
	if got, _ := read("", 19); len(got) != 19 {
		t.Errorf("no client known: read %d bytes, want 19", len(got))
	}
	if got, _ := read("c", 1); got != nil {
		t.Errorf("with the memory spent: read %q", got)
	}
	releaseA()
	if got, _ := read("a", 39); len(got) != 39 {
		t.Errorf("after its release, a's share: read %d bytes, want 39", len(got))
	}
}

// Attack: the upstream states a running total of the usage in every event
// of its stream (as Gemini's usageMetadata does), and the client has the
// last one carry content of its choosing (a function call's arguments)
// past the bound on an event. That event is skipped, and the total of an
// earlier one, far smaller than what the upstream billed, must not settle
// the charge: the stream states no usable cost.
func TestAttackStreamEventPastBoundKeepsEarlierUsage(t *testing.T) {
	args := strings.Repeat("a", 70<<10)
	got, why, w, _ := serve(t, mustParse(t, "body:usage.total_tokens"), func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"text\":\"ok\",\"usage\":{\"total_tokens\":12}}\n\n")
		fmt.Fprintf(w, "data: {\"call\":{\"args\":\"%s\"},\"usage\":{\"total_tokens\":90000}}\n\n", args)
	})
	if w.Code != 200 || why == "" {
		t.Fatalf("settled at %v (%q): the stream's last usage was skipped, and an earlier, smaller one charged", got, why)
	}
}

// Attack: as TestAttackStreamEventPastBoundKeepsEarlierUsage, but the
// client has the last event's content (a function call's arguments, a
// JSON object) nest deeper than a cost is read from. That event states
// its running total all the same: the earlier, smaller one must not
// settle the charge.
func TestAttackStreamEventTooDeepKeepsEarlierUsage(t *testing.T) {
	args := strings.Repeat("[", 200) + strings.Repeat("]", 200)
	got, why, _, _ := serve(t, mustParse(t, "body:usage.total_tokens"), func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"text\":\"ok\",\"usage\":{\"total_tokens\":12}}\n\n")
		fmt.Fprintf(w, "data: {\"call\":{\"args\":%s},\"usage\":{\"total_tokens\":90000}}\n\n", args)
	})
	if why == "" {
		t.Fatalf("settled at %v: the stream's last usage was not read, and an earlier, smaller one charged", got)
	}
}
