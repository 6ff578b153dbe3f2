package httpgate_test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// Attack: with a cost read from the request body, a client pays less than
// its request is worth by hiding the field where a partial read misses it
// or an upstream reads another: a body longer than what is read (a small
// max_tokens up front, padding after), a key given twice (the reader
// takes one, the upstream the other), or a body that is not quite JSON.
// Each costs at least default_cost, as a body without the field does; and
// the upstream reads every body whole.
func TestAttackBodyCostEvasion(t *testing.T) {
	e := newLLMEnv(t, llmPolicy)
	pad := strings.Repeat(" ", policy.CostBodyLimit)
	cases := []struct {
		name, body string
		want       float64
	}{
		{"a body past the limit", `{"max_tokens": 1, "messages": [` + pad + `]}`, 4000},
		{"a key given twice", `{"max_tokens": 1, "max_tokens": 9000}`, 9000},
		{"a key given twice, small last", `{"max_tokens": 9000, "max_tokens": 1}`, 9000},
		{"two JSON values", `{"max_tokens": 1} {"max_tokens": 9000}`, 4000},
		{"no field", `{"model": "m"}`, 4000},
	}
	for i, c := range cases {
		key := fmt.Sprintf("k%d", i)
		status, _ := call(t, e.proxy, "/v1/c", c.body, "X-Api-Key", key)
		if status != 200 {
			t.Fatalf("%s: %d", c.name, status)
		}
		if got := 10000 - e.level("tokens", key); got != c.want {
			t.Errorf("%s: charged %v, want %v", c.name, got, c.want)
		}
	}
	// The long body again, of no declared length (chunked): read up to
	// the limit, found longer, not parsed.
	req, _ := http.NewRequest("POST", e.proxy.URL+"/v1/c", io.MultiReader(strings.NewReader(cases[0].body)))
	req.Header.Set("X-Api-Key", "chunked")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("chunked: %v %v", resp, err)
	}
	resp.Body.Close()
	<-e.proxy.done
	if got := 10000 - e.level("tokens", "chunked"); got != 4000 {
		t.Errorf("a chunked body past the limit: charged %v, want 4000", got)
	}
	if want := fmt.Sprintf("%x", sha256.Sum256([]byte(cases[0].body))); e.up.bodies[0] != want || e.up.bodies[len(e.up.bodies)-1] != want {
		t.Error("the upstream did not read the long bodies whole")
	}
	for i, sum := range e.up.bodies {
		if len(sum) != 64 {
			t.Fatalf("request %d: the upstream did not read its body", i)
		}
	}
}

// Attack: many clients send large bodies at once to a rule that reads the
// cost from the body, to make the server hold them all in memory. The
// bodies held at once are bounded (Options.BodyMemory); a request beyond
// it is not read for its cost and pays default_cost, its body streamed to
// the upstream unread.
func TestAttackBodyMemory(t *testing.T) {
	clk := sluice.NewManualClock(sluiceEpoch)
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	// The upstream states no usage: each request is charged its estimate
	// (unsettled_cost is below every one), which shows what was read.
	p := mustPolicy(t, strings.Replace(llmPolicy, "unsettled_cost: 2000", "unsettled_cost: 1", 1))
	up := newLLMUpstream(t)
	upURL, _ := url.Parse(up.URL)
	g := httpgate.New(p, lim, httpgate.Options{BodyMemory: 100, Logger: slog.New(slog.DiscardHandler)})
	proxy := serve(t, g.Proxy(upURL, httpgate.ProxyOptions{}))
	small := `{"max_tokens": 7}`
	large := `{"max_tokens": 7, "pad": "` + strings.Repeat("x", 200) + `"}`
	call(t, proxy, "/v1/c", small, "X-Api-Key", "a")
	call(t, proxy, "/v1/c", large, "X-Api-Key", "b")
	if got := 10000 - conformance.Level(t, lim, p.Limit("tokens"), "a"); got != 7 {
		t.Errorf("a body within the memory bound: charged %v, want 7", got)
	}
	if got := 10000 - conformance.Level(t, lim, p.Limit("tokens"), "b"); got != 4000 {
		t.Errorf("a body beyond the memory bound: charged %v, want default_cost 4000", got)
	}
	if up.bodies[1] == "" {
		t.Error("the upstream did not get the large body")
	}
}

// Attack: one client opens many requests that declare large bodies and
// sends them slowly, to hold every byte of BodyMemory, so that every other
// client's body goes unread and is charged default_cost, the most a
// request may use: one client would move every other client's limit. A
// client holds at most its share of the bound
// (Options.BodyMemoryPerClient, a quarter by default); a body beyond it is
// its own to go unread, and another client's is read and charged what it
// says.
func TestAttackBodyMemoryHeldByOneClient(t *testing.T) {
	b := newBodyHolder(t, httpgate.Options{BodyMemory: 1000}) // a share of 250 bytes
	var held []*heldBody
	for i := range 4 { // a body of 249 bytes holds 250, a share's worth: four hold the whole bound
		held = append(held, b.hold("192.0.2.1", fmt.Sprintf("atk%d", i), 249))
	}
	if got := b.charged("atk1"); got != 4000 {
		t.Errorf("the attacker's body beyond its share: charged %v, want default_cost 4000", got)
	}
	b.send("198.51.100.7", "victim", `{"max_tokens": 7}`)
	if got := b.charged("victim"); got != 7 {
		t.Errorf("another client's body while one holds its share: charged %v, want 7", got)
	}
	for _, h := range held {
		h.finish(t)
	}
	if got := b.charged("atk0"); got != 7 {
		t.Errorf("the attacker's body within its share: charged %v, want 7", got)
	}
}

// A client's share comes back once the requests that held it end, however
// they end: a body sent whole, or one whose reading failed (a client that
// hung up, a read deadline that passed).
func TestBodyMemoryPerClientReleased(t *testing.T) {
	b := newBodyHolder(t, httpgate.Options{BodyMemory: 1000})
	whole := b.hold("2001:db8::1", "whole", 124)   // 125 bytes each: the two hold the share
	failed := b.hold("2001:db8::2", "failed", 124) // the same client, by its /64
	b.send("2001:db8::3", "over", `{"max_tokens": 7}`)
	if got := b.charged("over"); got != 4000 {
		t.Errorf("beyond the share: charged %v, want default_cost 4000", got)
	}
	whole.finish(t)
	failed.pw.CloseWithError(errors.New("the client hung up"))
	failed.wait(t)
	// 249 bytes take the whole share of 250.
	b.send("2001:db8::4", "after", bodyOf(249))
	if got := b.charged("after"); got != 7 {
		t.Errorf("with the share given back: charged %v, want 7", got)
	}
}

// Options.BodyMemoryPerClient sets the share: here two bodies of 250
// bytes, where the default quarter holds one.
func TestBodyMemoryPerClientOption(t *testing.T) {
	b := newBodyHolder(t, httpgate.Options{BodyMemory: 1000, BodyMemoryPerClient: 500})
	first := b.hold("192.0.2.1", "first", 249)
	second := b.hold("192.0.2.1", "second", 249)
	b.send("192.0.2.1", "third", `{"max_tokens": 7}`)
	first.finish(t)
	second.finish(t)
	for key, want := range map[string]float64{"first": 7, "second": 7, "third": 4000} {
		if got := b.charged(key); got != want {
			t.Errorf("%s: charged %v, want %v", key, got, want)
		}
	}
}

// Attack: one client's requests have the upstream answer large JSON,
// whose usage the gate reads once the body ends, and it reads the answers
// slowly, to have the gate hold a buffer of each in flight: the server's
// memory, and every other client's settlement, in its hands. The JSON
// held is bounded as request bodies are (Options.BodyMemory and its
// per-client share): the client's answers beyond its share are passed on
// whole, unread, and charged unsettled_cost; another client's answer is
// read and settled at the usage it states.
func TestAttackResponseBodyMemoryHeldByOneClient(t *testing.T) {
	doc := fmt.Sprintf(`{"pad":"%s","usage":{"total_tokens":3}}`, strings.Repeat("x", 900<<10))
	arrived, release := make(chan struct{}), make(chan struct{})
	b := newBodyHolder(t, httpgate.Options{BodyMemory: 4 << 20, BodyMemoryPerClient: 2 << 20}) // two answers a client
	b.h = b.g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(doc)))
		io.WriteString(w, doc[:len(doc)-10])
		if r.Header.Get("X-Api-Key") != "victim" {
			arrived <- struct{}{} // read slowly: held until release
			<-release
		}
		io.WriteString(w, doc[len(doc)-10:])
	}))
	got := make([]*httptest.ResponseRecorder, 4)
	done := make(chan struct{})
	for i := range got {
		got[i] = httptest.NewRecorder()
		go func() {
			defer func() { done <- struct{}{} }()
			body := `{"max_tokens": 7}`
			b.h.ServeHTTP(got[i], b.request("192.0.2.1", fmt.Sprintf("atk%d", i), strings.NewReader(body), len(body)))
		}()
	}
	for range got {
		<-arrived
	}
	b.send("198.51.100.7", "victim", `{"max_tokens": 7}`)
	if got := b.charged("victim"); got != 3 {
		t.Errorf("another client's answer while one holds its share: charged %v, want the 3 stated", got)
	}
	close(release)
	for range got {
		<-done
	}
	settled := 0
	for i, w := range got {
		if w.Body.String() != doc {
			t.Errorf("atk%d: the answer did not reach the client whole", i)
		}
		switch c := b.charged(fmt.Sprintf("atk%d", i)); c {
		case 3:
			settled++
		case 7: // unsettled_cost, never below the estimate
		default:
			t.Errorf("atk%d: charged %v, want 3 or the unsettled 7", i, c)
		}
	}
	if settled != 2 {
		t.Errorf("%d of the client's 4 answers in flight read and settled, want its share's 2", settled)
	}
}

// bodyHolder is a middleware whose rule reads the cost from the body,
// and whose handler reads each body whole.
type bodyHolder struct {
	t   *testing.T
	lim *sluice.Limiter
	p   *policy.Policy
	g   *httpgate.Gate
	h   http.Handler
}

func newBodyHolder(t *testing.T, opts httpgate.Options) *bodyHolder {
	clk := sluice.NewManualClock(sluiceEpoch)
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	// The handler states no usage: each request is charged its estimate
	// (unsettled_cost is below every one), which shows what was read.
	p := mustPolicy(t, strings.Replace(llmPolicy, "unsettled_cost: 2000", "unsettled_cost: 1", 1))
	opts.Logger = slog.New(slog.DiscardHandler)
	g := httpgate.New(p, lim, opts)
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	return &bodyHolder{t, lim, p, g, h}
}

// bodyOf is a body of n bytes that states max_tokens 7.
func bodyOf(n int) string {
	const head, tail = `{"max_tokens": 7, "pad": "`, `"}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// request is a request from addr for key with body.
func (b *bodyHolder) request(addr, key string, body io.Reader, n int) *http.Request {
	r := httptest.NewRequest("POST", "/v1/c", body)
	r.ContentLength = int64(n)
	r.RemoteAddr = net.JoinHostPort(addr, "40000")
	r.Header.Set("X-Api-Key", key)
	return r
}

// send sends a whole body from addr for key.
func (b *bodyHolder) send(addr, key, body string) {
	b.h.ServeHTTP(httptest.NewRecorder(), b.request(addr, key, strings.NewReader(body), len(body)))
}

// charged is what key's requests were charged.
func (b *bodyHolder) charged(key string) float64 {
	return 10000 - conformance.Level(b.t, b.lim, b.p.Limit("tokens"), key)
}

// heldBody is a request whose body is sent in part.
type heldBody struct {
	pw   *io.PipeWriter
	rest string
	done chan struct{}
}

// hold sends from addr, for key, a request that declares a body of n
// bytes and sends its first 20 only. It returns once the gate has read
// them: the body is then in the gate's hands, held for its cost or
// handed on unread (and the request decided).
func (b *bodyHolder) hold(addr, key string, n int) *heldBody {
	pr, pw := io.Pipe()
	body := bodyOf(n)
	h := &heldBody{pw: pw, rest: body[20:], done: make(chan struct{})}
	go func() {
		defer close(h.done)
		b.h.ServeHTTP(httptest.NewRecorder(), b.request(addr, key, pr, n))
	}()
	h.write(b.t, body[:20])
	return h
}

// write sends s, waiting until it is read.
func (h *heldBody) write(t *testing.T, s string) {
	t.Helper()
	wrote := make(chan error, 1)
	go func() { _, err := io.WriteString(h.pw, s); wrote <- err }()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing read the body")
	}
}

// finish sends the rest of the body and waits for the request to end.
func (h *heldBody) finish(t *testing.T) {
	t.Helper()
	h.write(t, h.rest)
	h.pw.Close()
	h.wait(t)
}

// wait waits for the request to end.
func (h *heldBody) wait(t *testing.T) {
	t.Helper()
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not end")
	}
}

// Attack: a model server written in Python (FastAPI's request.json(), as
// vLLM's) reads a request body with json.loads, which takes UTF-16, UTF-32
// and a UTF-8 byte order mark, and NaN and Infinity as numbers. A client
// sending max_tokens in such a body, which Go's JSON reader refuses,
// would pay default_cost for a request the upstream serves whole; the
// cost reader reads the body as json.loads does.
func TestAttackBodyCostReadAsPythonReadsIt(t *testing.T) {
	e := newLLMEnv(t, llmPolicy)
	body := `{"max_tokens": 9000, "messages": []}`
	utf16 := func(big bool) string {
		var b []byte
		for _, c := range "\ufeff" + body {
			if big {
				b = append(b, byte(c>>8), byte(c))
			} else {
				b = append(b, byte(c), byte(c>>8))
			}
		}
		return string(b)
	}
	utf32le := func() string {
		var b []byte
		for _, c := range body {
			b = append(b, byte(c), 0, 0, 0)
		}
		return string(b)
	}
	cases := []struct{ name, body string }{
		{"a UTF-8 byte order mark", "\xef\xbb\xbf" + body},
		{"UTF-16, big-endian with its mark", utf16(true)},
		{"UTF-16, little-endian with its mark", utf16(false)},
		{"UTF-32 without a mark", utf32le()},
		{"NaN elsewhere", `{"max_tokens": 9000, "temperature": NaN, "x": [Infinity, -Infinity]}`},
		{"NaN in a string is no token", `{"max_tokens": 9000, "stop": "NaN\"Infinity"}`},
	}
	for i, c := range cases {
		key := fmt.Sprintf("py%d", i)
		if status, _ := call(t, e.proxy, "/v1/c", c.body, "X-Api-Key", key); status != 200 {
			t.Fatalf("%s: %d", c.name, status)
		}
		if got := 10000 - e.level("tokens", key); got != 9000 {
			t.Errorf("%s: charged %v, want 9000", c.name, got)
		}
	}
	// A NaN where the cost is costs the default, as a string there does.
	if status, _ := call(t, e.proxy, "/v1/c", `{"max_tokens": NaN}`, "X-Api-Key", "nan"); status != 200 {
		t.Fatalf("NaN cost: %d", status)
	}
	if got := 10000 - e.level("tokens", "nan"); got != 4000 {
		t.Errorf("NaN cost: charged %v, want 4000", got)
	}
}

// Attack: a model server that validates its request with pydantic (vLLM,
// and FastAPI services generally) reads an integer field given as a
// string, "9000", " 9000 " or "9_000", as the number. A client sending
// max_tokens so would pay default_cost for the request the upstream
// serves with 9000; the cost reader reads a number in a string as it.
func TestAttackBodyCostNumberInString(t *testing.T) {
	e := newLLMEnv(t, llmPolicy)
	for i, v := range []string{`"9000"`, `" 9000 "`, `"9_000"`, `"9000.0"`} {
		key := fmt.Sprintf("str%d", i)
		if status, _ := call(t, e.proxy, "/v1/c", `{"max_tokens": `+v+`}`, "X-Api-Key", key); status != 200 {
			t.Fatalf("%s: %d", v, status)
		}
		if got := 10000 - e.level("tokens", key); got != 9000 {
			t.Errorf("max_tokens %s: charged %v, want 9000", v, got)
		}
	}
	// A string that is no number costs the default.
	if status, _ := call(t, e.proxy, "/v1/c", `{"max_tokens": "many"}`, "X-Api-Key", "many"); status != 200 {
		t.Fatalf("many: %d", status)
	}
	if got := 10000 - e.level("tokens", "many"); got != 4000 {
		t.Errorf(`max_tokens "many": charged %v, want 4000`, got)
	}
}
