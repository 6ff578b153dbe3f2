package settle_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
	mem := settle.NewBodyMemory(64<<20, 64<<20)
	settle.Serve(h, w, httptest.NewRequest("POST", "/", nil), []*settle.Source{s}, nil, mem, "c", func(rec *settle.Recorder) {
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

// slowClient is a client that reads a response slowly: its last write
// blocks, once the Recorder has taken in the whole body, until release.
type slowClient struct {
	*httptest.ResponseRecorder
	last    int // the length of the body once the last write is in
	arrived chan<- struct{}
	release <-chan struct{}
}

func (c *slowClient) Write(b []byte) (int, error) {
	if c.Body.Len()+len(b) == c.last {
		c.arrived <- struct{}{}
		<-c.release
	}
	return c.ResponseRecorder.Write(b)
}

// inFlight serves doc, a JSON response, to one request of each of
// clients at once, all in flight until every one has been written up to
// its last piece, and returns what of mem was free then and the most one
// client held, why each was not settled ("" when it was), and
// whether each client got doc whole. declared sets Content-Length.
func inFlight(t *testing.T, mem *settle.BodyMemory, clients []string, doc string, declared bool) (free, ofOne int64, whys []string, whole []bool) {
	t.Helper()
	src := mustParse(t, "body:usage.total_tokens")
	arrived, release := make(chan struct{}), make(chan struct{})
	whys, whole = make([]string, len(clients)), make([]bool, len(clients))
	var wg sync.WaitGroup
	for i, client := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &slowClient{ResponseRecorder: httptest.NewRecorder(), last: len(doc), arrived: arrived, release: release}
			h := func(w http.ResponseWriter, _ *http.Request) {
				if declared {
					w.Header().Set("Content-Length", fmt.Sprint(len(doc)))
				}
				// In pieces, as a proxy copies an upstream's body.
				for rest := doc; rest != ""; {
					n := min(len(rest), 32<<10)
					io.WriteString(w, rest[:n])
					rest = rest[n:]
					// The buffer never holds more than was reserved for it.
					if c, r := w.(*settle.Recorder).Buffer(); int64(c) != r {
						t.Errorf("a buffer of %d bytes, %d reserved", c, r)
					}
				}
			}
			settle.Serve(http.HandlerFunc(h), w, httptest.NewRequest("POST", "/", nil), []*settle.Source{src}, nil, mem, client, func(rec *settle.Recorder) {
				var got float64
				if got, whys[i] = rec.Actual(0); whys[i] == "" && got != 3 {
					t.Errorf("settled at %v, want the 3 stated", got)
				}
			})
			whole[i] = w.Body.String() == doc
		}()
	}
	for range clients {
		<-arrived
	}
	for _, c := range clients {
		ofOne = max(ofOne, mem.HeldBy(c))
	}
	free = mem.Free()
	close(release)
	wg.Wait()
	return free, ofOne, whys, whole
}

// Attack: many clients, or one, have the upstream answer large JSON (a
// body:PATH cost is read from it once it ends) and read the answers
// slowly, to have the server hold a buffer of up to a MiB, and more, for
// each response in flight, with no bound. The JSON held at once is
// bounded, in all and for each client, as request bodies are
// (BodyMemory); a response beyond it is not held, is passed on whole all
// the same, and states no cost: the door charges it unsettled_cost.
func TestAttackResponseBodyMemory(t *testing.T) {
	const total, share = 4 << 20, 2 << 20
	doc := fmt.Sprintf(`{"pad":"%s","usage":{"total_tokens":3}}`, strings.Repeat("x", 900<<10))
	for _, declared := range []bool{true, false} {
		mem := settle.NewBodyMemory(total, share)
		// One client: two responses fill its share, whatever is left in all.
		one := make([]string, 6)
		for i := range one {
			one[i] = "192.0.2.1"
		}
		// Many clients: four responses fill the bound in all (undeclared
		// lengths hold a MiB each, as their buffers double to it).
		var many []string
		for i := range 10 {
			many = append(many, fmt.Sprintf("198.51.100.%d", i))
		}
		for _, c := range []struct {
			name    string
			clients []string
			settled int
			bound   int64
		}{
			{"one client", one, 2, share},
			{"many clients", many, 4, total},
		} {
			free, ofOne, whys, whole := inFlight(t, mem, c.clients, doc, declared)
			settled := 0
			for i, why := range whys {
				if !whole[i] {
					t.Errorf("%s (length declared: %v): a response did not reach its client whole", c.name, declared)
				}
				switch why {
				case "":
					settled++
				case "no cost stated": // charged unsettled_cost
				default:
					t.Errorf("%s (length declared: %v): %q, want no cost stated", c.name, declared, why)
				}
			}
			// Undeclared, the buffers grow as they are written, and those
			// in flight may share the bound in ways none of them can grow
			// through: fewer may be held.
			if settled > c.settled || settled < 1 || declared && settled != c.settled || total-free > c.bound || ofOne > share {
				t.Errorf("%s (length declared: %v): %d of %d responses held and settled, %d bytes held (%d by one client), want %d within %d",
					c.name, declared, settled, len(whys), total-free, ofOne, c.settled, c.bound)
			}
			if free := mem.Free(); free != total {
				t.Errorf("%s: %d bytes still held once the responses ended", c.name, total-free)
			}
		}
	}
}

// A gzip response's body is held decompressed too, in the same memory:
// one that decompresses to more than is left states no cost, and one
// that fits settles what it states.
func TestServeGzipHeld(t *testing.T) {
	doc := fmt.Sprintf(`{"pad":"%s","usage":{"total_tokens":3}}`, strings.Repeat("x", 900<<10))
	zipped := gzipped(doc)
	for _, c := range []struct {
		total int64
		want  string
	}{{2 << 20, ""}, {512 << 10, "no cost stated"}} {
		mem := settle.NewBodyMemory(c.total, c.total)
		w := httptest.NewRecorder()
		var got float64
		var why string
		settle.Serve(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(zipped)
		}), w, httptest.NewRequest("POST", "/", nil), []*settle.Source{mustParse(t, "body:usage.total_tokens")}, nil, mem, "c", func(rec *settle.Recorder) {
			got, why = rec.Actual(0)
		})
		if why != c.want || (why == "" && got != 3) || !bytes.Equal(w.Body.Bytes(), zipped) {
			t.Errorf("in %d bytes: read %v (%q), want %q", c.total, got, why, c.want)
		}
		if mem.Free() != c.total {
			t.Errorf("in %d bytes: %d still held once the response ended", c.total, c.total-mem.Free())
		}
	}
}
