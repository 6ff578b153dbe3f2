package httpgate_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// llmPolicy charges a model's tokens per API key: max_tokens of the
// request up front, settled from what the upstream reports it used (its
// JSON body or the last event of its stream, a header, a trailer).
const llmPolicy = `
rules:
  - name: tokens
    limit_keys: ["header:x-api-key"]
    match: {path_prefix: /v1/}
    algorithm_config:
      rate: 1
      period: 1h
      capacity: 10000
      cost_source: "body:max_tokens"
      default_cost: 4000
      settle_from: "body:usage.total_tokens"
      unsettled_cost: 2000
  - name: by-header
    limit_keys: ["header:x-api-key"]
    match: {path_prefix: /header}
    algorithm_config: {rate: 1, period: 1h, capacity: 1000, cost_source: "header:x-estimate", default_cost: 100, settle_from: "header:x-usage-tokens", unsettled_cost: 150}
  - name: by-trailer
    limit_keys: ["header:x-api-key"]
    match: {path_prefix: /trailer}
    algorithm_config: {rate: 1, period: 1h, capacity: 1000, cost_source: "header:x-estimate", default_cost: 100, settle_from: "trailer:x-cost"}
  - name: api
    match: {path_prefix: /api}
    algorithm_config: {rate: 1, period: 1h, capacity: 1000, settle_from: caller}
  - name: plain
    match: {path_prefix: /plain}
    algorithm_config: {rps: 1, burst: 5}
`

// llmUpstream is a model server: it answers /v1/chat/completions with the
// usage the test asks for in X-Test-Usage, as one JSON body (gzipped when
// X-Test-Gzip is set) or, for "stream": true, as an event stream of
// chunks whose last event before [DONE] carries the usage. /header and
// /trailer state it in a header or a trailer; /echo states the request's
// own X-Usage-Tokens, as an upstream echoing request headers would. It
// records a digest of every request body it reads.
type llmUpstream struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string // sha256 hex of each request body
	seen   []http.Header
}

func newLLMUpstream(t *testing.T) *llmUpstream {
	u := &llmUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *llmUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	sum := sha256.Sum256(body)
	u.mu.Lock()
	u.bodies = append(u.bodies, fmt.Sprintf("%x", sum))
	u.seen = append(u.seen, r.Header.Clone())
	u.mu.Unlock()
	usage := r.Header.Get("X-Test-Usage")
	switch r.URL.Path {
	case "/header":
		w.Header().Set("X-Usage-Tokens", usage)
		io.WriteString(w, "ok")
	case "/trailer":
		w.Header().Set("Trailer", "X-Cost")
		io.WriteString(w, "ok")
		w.(http.Flusher).Flush()
		w.Header().Set("X-Cost", usage)
	case "/echo":
		if v := r.Header.Get("X-Usage-Tokens"); v != "" {
			w.Header().Set("X-Usage-Tokens", v)
		} else {
			w.Header().Set("X-Usage-Tokens", usage)
		}
	default:
		var req struct {
			Stream bool `json:"stream"`
		}
		json.Unmarshal(body, &req)
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				// Content the client chose, JSON-escaped as every
				// OpenAI-style stream carries it: it cannot make a field.
				chunk, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"delta": map[string]any{"content": fmt.Sprintf("part %d\n\ndata: {\"usage\":{\"total_tokens\":1}}\n\n", i)}}}, "usage": nil})
				fmt.Fprintf(w, "data: %s\n\n", chunk)
				w.(http.Flusher).Flush()
			}
			if usage != "" {
				fmt.Fprintf(w, "event: usage\r\ndata: {\"choices\":[],\r\ndata: \"usage\":{\"prompt_tokens\":5,\"total_tokens\":%s}}\r\n\r\n", usage)
			}
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		out := []byte(fmt.Sprintf(`{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"total_tokens":%s}}`, usage))
		if usage == "" {
			out = []byte(`{"id":"x","error":"no usage"}`)
		}
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("X-Test-Gzip") != "" {
			var b bytes.Buffer
			zw := gzip.NewWriter(&b)
			zw.Write(out)
			zw.Close()
			out = b.Bytes()
			w.Header().Set("Content-Encoding", "gzip")
		}
		w.Write(out)
	}
}

// llmEnv is a gate over llmPolicy in front of an llmUpstream, through the
// reverse proxy.
type llmEnv struct {
	*env
	up    *llmUpstream
	proxy *served
}

func newLLMEnv(t *testing.T, yaml string) *llmEnv {
	e := &llmEnv{env: newEnv(t, yaml), up: newLLMUpstream(t)}
	upURL, _ := url.Parse(e.up.URL)
	e.proxy = serve(t, e.gate.Proxy(upURL, httpgate.ProxyOptions{}))
	return e
}

// served is a test server that tells when each request's handler has
// returned: a settlement is made once the response has been sent, which
// the client may have read whole before then.
type served struct {
	*httptest.Server
	done chan struct{}
}

func serve(t *testing.T, h http.Handler) *served {
	s := &served{done: make(chan struct{}, 1024)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { s.done <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// call sends body to path through srv with headers in pairs, and waits
// for its handler to return; it returns the status and the response body
// as the client read it.
func call(t *testing.T, srv *served, path, body string, hdr ...string) (int, string) {
	t.Helper()
	defer func() { <-srv.done }()
	req, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// level is the tokens of rule's bucket for key.
func (e *env) level(rule, key string) float64 {
	e.t.Helper()
	return conformance.Level(e.t, e.gate.Limiter(), e.gate.Policy().Limit(rule), key)
}

// The proxy charges max_tokens up front and settles at the usage the
// model reports: in a JSON body, gzipped or not, and in the last event of
// a stream that carries it, read as the stream passes. A response that
// states no usage is charged unsettled_cost, or the estimate when that
// is more.
func TestProxySettlesFromBody(t *testing.T) {
	e := newLLMEnv(t, llmPolicy)
	steps := []struct {
		name, body string
		hdr        []string
		charged    float64 // what the bucket holds less after the request
	}{
		{"json, used less", `{"max_tokens": 1000}`, []string{"X-Test-Usage", "312"}, 312},
		{"json, used more", `{"max_tokens": 100}`, []string{"X-Test-Usage", "250"}, 250},
		{"gzip json", `{"max_tokens": 1000}`, []string{"X-Test-Usage", "40", "X-Test-Gzip", "1", "Accept-Encoding", "gzip"}, 40},
		{"stream", `{"max_tokens": 1000, "stream": true}`, []string{"X-Test-Usage", "777"}, 777},
		{"stream without usage", `{"max_tokens": 600, "stream": true}`, nil, 2000},
		{"json without usage", `{"max_tokens": 500}`, nil, 2000},
		{"no max_tokens", `{"model": "m"}`, []string{"X-Test-Usage", "10"}, 10},
		{"used nothing", `{"max_tokens": 300}`, []string{"X-Test-Usage", "0"}, 0},
		{"without usage, estimate above unsettled_cost", `{"max_tokens": 3000}`, nil, 3000},
	}
	want := 10000.0
	for _, s := range steps {
		hdr := append([]string{"X-Api-Key", "k1", "Content-Type", "application/json"}, s.hdr...)
		status, body := call(t, e.proxy, "/v1/chat/completions", s.body, hdr...)
		if status != 200 {
			t.Fatalf("%s: %d %s", s.name, status, body)
		}
		want -= s.charged
		if got := e.level("tokens", "k1"); got != want {
			t.Fatalf("%s: the bucket holds %v, want %v", s.name, got, want)
		}
	}
	// The upstream read every body whole, as the client sent it.
	for i, s := range steps {
		if sum := fmt.Sprintf("%x", sha256.Sum256([]byte(s.body))); e.up.bodies[i] != sum {
			t.Errorf("%s: the upstream read another body", s.name)
		}
	}
}

// The stream reaches the client as the upstream sends it, byte for byte.
func TestProxySettleStreamPassesThrough(t *testing.T) {
	e := newLLMEnv(t, llmPolicy)
	direct := serve(t, http.HandlerFunc(e.up.serve))
	hdr := []string{"X-Api-Key", "k1", "X-Test-Usage", "55"}
	_, viaProxy := call(t, e.proxy, "/v1/x", `{"max_tokens": 10, "stream": true}`, hdr...)
	_, want := call(t, direct, "/v1/x", `{"max_tokens": 10, "stream": true}`, hdr...)
	if viaProxy != want {
		t.Fatalf("the client read\n%q\nthe upstream sent\n%q", viaProxy, want)
	}
	if got := e.level("tokens", "k1"); got != 10000-55 {
		t.Fatalf("the bucket holds %v, want %v", got, 10000-55)
	}
}

// A response header or trailer states the actual cost as well.
func TestProxySettlesFromHeaderAndTrailer(t *testing.T) {
	e := newLLMEnv(t, llmPolicy)
	for _, c := range []struct {
		path, rule, estimate, usage string
		want                        float64
	}{
		{"/header", "by-header", "50", "20", 980},
		{"/header", "by-header", "50", "80", 900},
		{"/header", "by-header", "50", "junk", 750}, // not a cost: unsettled_cost
		{"/trailer", "by-trailer", "50", "7", 993},
		{"/trailer", "by-trailer", "5", "100", 893},
	} {
		status, body := call(t, e.proxy, c.path, "", "X-Api-Key", "k1", "X-Estimate", c.estimate, "X-Test-Usage", c.usage)
		if status != 200 {
			t.Fatalf("%s: %d %s", c.path, status, body)
		}
		if got := e.level(c.rule, "k1"); got != c.want {
			t.Fatalf("%s, estimate %s, usage %s: the bucket holds %v, want %v", c.path, c.estimate, c.usage, got, c.want)
		}
	}
}

// The middleware settles as the proxy does, from what the handler writes:
// here an event stream written in pieces that split lines and events.
func TestMiddlewareSettles(t *testing.T) {
	clk := sluice.NewManualClock(sluiceEpoch)
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	p := mustPolicy(t, llmPolicy)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), "max_tokens") {
			http.Error(w, "the body did not arrive", 400)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		stream := `data: {"usage":null}` + "\n\n: a comment\ndata: {\"usage\":{\"total_tokens\":" + r.Header.Get("X-Test-Usage") + "}}\n\ndata: [DONE]\n\n"
		for len(stream) > 0 {
			n := min(len(stream), 7)
			io.WriteString(w, stream[:n])
			w.(http.Flusher).Flush()
			stream = stream[n:]
		}
	})
	srv := serve(t, httpgate.Middleware(p, lim, httpgate.Options{})(app))
	status, body := call(t, srv, "/v1/chat", `{"max_tokens": 900}`, "X-Api-Key", "k2", "X-Test-Usage", "123")
	if status != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("%d %q", status, body)
	}
	if got := conformance.Level(t, lim, p.Limit("tokens"), "k2"); got != 10000-123 {
		t.Fatalf("the bucket holds %v, want %v", got, 10000-123)
	}
}

// Requests of one key settling at once through the proxy end where their
// actual costs put the bucket.
func TestProxySettlesConcurrently(t *testing.T) {
	e := newLLMEnv(t, llmPolicy)
	var wg sync.WaitGroup
	const n = 40
	total := 0.0
	for i := range n {
		usage := 10 + 13*i%97
		total += float64(usage)
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"max_tokens": %d, "stream": %v}`, 50, i%2 == 0)
			if status, b := call(t, e.proxy, "/v1/c", body, "X-Api-Key", "k3", "X-Test-Usage", strconv.Itoa(usage)); status != 200 {
				t.Errorf("%d %s", status, b)
			}
		}()
	}
	wg.Wait()
	if got := e.level("tokens", "k3"); got != 10000-total {
		t.Fatalf("after %d settled requests the bucket holds %v, want %v", n, got, 10000-total)
	}
}

// takeHandle takes cost from rule for key through /v1/take and returns
// the answer's settlement handle.
func (e *env) takeHandle(rule, key string, cost float64) string {
	e.t.Helper()
	resp, m := e.post("/v1/take", fmt.Sprintf(`{"rule":%q,"key":%q,"cost":%v}`, rule, key, cost))
	h, _ := m["settle"].(string)
	if resp.StatusCode != 200 || m["allowed"] != true || h == "" {
		e.t.Fatalf("take: %d %v", resp.StatusCode, m)
	}
	return h
}

// The decision API settles a take with the handle its answer carries:
// what was used less is refunded, what was used more charged.
func TestSettleAPI(t *testing.T) {
	e := newEnv(t, llmPolicy)
	h := e.takeHandle("api", "u1", 100)
	resp, m := e.post("/v1/settle", fmt.Sprintf(`{"handle":%q,"actual":30}`, h))
	if resp.StatusCode != 200 {
		t.Fatalf("settle: %d %v", resp.StatusCode, m)
	}
	wantFields(t, m, map[string]any{"rule": "api", "key": "u1", "charged": 100, "actual": 30, "refunded": 70, "extra": 0, "forgiven": 0, "tokens": 970, "remaining": 970, "limit": 1000})
	h = e.takeHandle("api", "u1", 10)
	_, m = e.post("/v1/settle", fmt.Sprintf(`{"handle":%q,"actual":1500}`, h))
	// 1490 more: 970 - 10 - 1490 is 530 in debt, all of it charged.
	wantFields(t, m, map[string]any{"refunded": 0, "extra": 1490, "forgiven": 0, "tokens": -530, "remaining": 0})
	// A limit that does not settle gives no handle.
	if _, m := e.post("/v1/take", `{"rule":"plain","key":"u1"}`); m["allowed"] != true || m["settle"] != nil {
		t.Fatalf("take of a limit without settle_from: %v", m)
	}
	// Nor does a rejected take, which charged nothing.
	if _, m := e.post("/v1/take", `{"rule":"api","key":"u1","cost":600}`); m["allowed"] != false || m["settle"] != nil {
		t.Fatalf("rejected take: %v", m)
	}
	// Each take of a batch has its own.
	_, m = e.post("/v1/take", `{"takes":[{"rule":"api","key":"u2","cost":5},{"rule":"plain","key":"u2"},{"rule":"tokens","key":"u2","cost":9}]}`)
	takes, _ := m["takes"].([]any)
	if len(takes) != 3 || m["settle"] != nil {
		t.Fatalf("batch: %v", m)
	}
	for i, want := range []bool{true, false, true} {
		_, has := takes[i].(map[string]any)["settle"]
		if has != want {
			t.Errorf("batch take %d has a handle: %v, want %v", i, has, want)
		}
	}
	h = takes[2].(map[string]any)["settle"].(string)
	if _, m := e.post("/v1/settle", fmt.Sprintf(`{"handle":%q,"actual":9}`, h)); m["tokens"] != nil || m["refunded"] != 0.0 {
		t.Fatalf("a settlement at the charge changes nothing: %v", m)
	}
	if got := e.level("tokens", "u2"); got != 10000-9 {
		t.Fatalf("tokens/u2 holds %v", got)
	}
}

// tokenPolicy is the README's llm-tokens rule as it stood before
// unsettled_cost: a client's max_tokens charged up front, settled from
// the usage the model reports.
const tokenPolicy = `
rules:
  - name: llm-tokens
    limit_keys: ["header:x-api-key"]
    match: { path_prefix: /v1/chat/completions }
    algorithm_config:
      rate: 100000
      period: 1m
      capacity: 100000
      cost_source: "body:max_tokens"
      default_cost: 8000
      settle_from: "body:usage.total_tokens"
`

// modelServer is an OpenAI-style model behind the proxy, counting the
// tokens it uses per API key. A request uses one token per byte of its
// prompt plus one it generates, and is refused (400, no usage, nothing
// used) when that is more than context. It answers in the encoding the
// request accepts first among br, deflate and gzip (br as bytes no one
// here can read), or none; a stream reports its usage in its last event
// only when stream_options.include_usage is set, as OpenAI's does. With
// X-Test-Hold the stream stops after its first event until the proxy
// gives up on it. With together > 0 each request waits, up to 5 s, until
// that many have arrived, so that they are all admitted before any
// settles.
type modelServer struct {
	*httptest.Server
	context  int64
	together int

	mu      sync.Mutex
	used    map[string]int64
	arrived int
	all     chan struct{}
}

func newModelServer(t *testing.T, context int64, together int) *modelServer {
	m := &modelServer{context: context, together: together, used: map[string]int64{}, all: make(chan struct{})}
	m.Server = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.Close)
	return m
}

func (m *modelServer) usedBy(key string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used[key]
}

func (m *modelServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Prompt        string `json:"prompt"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if json.Unmarshal(body, &req) != nil {
		http.Error(w, "bad json", 400)
		return
	}
	if m.together > 0 {
		m.mu.Lock()
		if m.arrived++; m.arrived == m.together {
			close(m.all)
		}
		m.mu.Unlock()
		select {
		case <-m.all:
		case <-time.After(5 * time.Second):
		}
	}
	used := int64(len(req.Prompt)) + 1
	if used > m.context {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		io.WriteString(w, `{"error":{"code":"context_length_exceeded"}}`)
		return
	}
	m.mu.Lock()
	m.used[r.Header.Get("X-Api-Key")] += used
	m.mu.Unlock()
	usage := fmt.Sprintf(`"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d}`, used-1, used)
	var out io.Writer = w
	for _, enc := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		switch enc = strings.TrimSpace(strings.SplitN(enc, ";", 2)[0]); enc {
		case "br":
			w.Header().Set("Content-Encoding", "br")
			out = io.Discard // what it sends instead is of no matter: no one here reads br
			w.Write([]byte{0x1b, 0x2f, 0x00, 0xa4})
		case "deflate":
			zw := zlib.NewWriter(w)
			defer zw.Close()
			w.Header().Set("Content-Encoding", "deflate")
			out = zw
		case "gzip":
			zw := gzip.NewWriter(w)
			defer zw.Close()
			w.Header().Set("Content-Encoding", "gzip")
			out = zw
		default:
			continue
		}
		break
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(out, `{"choices":[{"message":{"content":"x"}}],%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(out, `data: {"choices":[{"delta":{"content":"x"}}]}`+"\n\n")
	if f, ok := out.(interface{ Flush() error }); ok {
		f.Flush()
	}
	w.(http.Flusher).Flush()
	if r.Header.Get("X-Test-Hold") != "" {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(out, `data: {"choices":[],%s}`+"\n\n", usage)
	}
	io.WriteString(out, "data: [DONE]\n\n")
	if r.Header.Get("X-Test-Linger") != "" {
		// Slow to end its body: the client has what it wants first.
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}
}

// attackEnv is a gate over a policy in front of a modelServer, through the
// reverse proxy.
type attackEnv struct {
	*env
	model *modelServer
	proxy *served
}

func newAttackEnv(t *testing.T, p *policy.Policy, context int64, together int) *attackEnv {
	e := &attackEnv{env: newEnvPolicy(t, p, nil), model: newModelServer(t, context, together)}
	upURL, _ := url.Parse(e.model.URL)
	e.proxy = serve(t, e.gate.Proxy(upURL, httpgate.ProxyOptions{}))
	return e
}

// send makes one chat request for key through the proxy, as a client
// that reads the answer whole or, with cut, only up to the stream's first
// event before it hangs up; it waits for the proxy's handler to return
// (a settlement is made by then) and returns the status.
func (e *attackEnv) send(key, body string, cut bool, hdr ...string) int {
	e.t.Helper()
	defer func() { <-e.proxy.done }()
	req, _ := http.NewRequest("POST", e.proxy.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if cut {
		req.Header.Set("X-Test-Hold", "1")
	}
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		e.t.Error(err)
		return 0
	}
	if cut && resp.StatusCode == 200 {
		buf := make([]byte, 1)
		resp.Body.Read(buf) // the first event is on its way: then leave
		resp.Body.Close()
		return resp.StatusCode
	}
	if req.Header.Get("X-Test-Linger") != "" {
		// Read up to the stream's end marker, as OpenAI's clients do, and
		// hang up there.
		var got []byte
		buf := make([]byte, 512)
		for !bytes.Contains(got, []byte("data: [DONE]\n\n")) {
			n, err := resp.Body.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				break
			}
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// charged is what key's requests were charged in all: the capacity less
// what its bucket holds (the clock stands still, so nothing refilled).
func (e *attackEnv) charged(rule, key string) float64 {
	return e.gate.Policy().Limit(rule).Capacity() - e.level(rule, key)
}

func prompt(n int) string {
	b, _ := json.Marshal(strings.Repeat("p", n))
	return string(b)
}

// The attack: streams that carry no usage (OpenAI's default without
// stream_options.include_usage), each declaring max_tokens: 1 and using
// 5,001 tokens of prompt. Before, each was charged its 1-token estimate:
// 20 of them used 100,020 tokens for 20. Every token used must be
// charged: a stream that states no usage costs unsettled_cost (here the
// default, the capacity), so the first empties the bucket and the rest
// are refused.
func TestAttackSettleStreamWithoutUsage(t *testing.T) {
	e := newAttackEnv(t, mustPolicy(t, tokenPolicy), 1<<20, 0)
	body := `{"model":"m","max_tokens":1,"stream":true,"prompt":` + prompt(5000) + `}`
	for range 20 {
		e.send("k", body, false)
	}
	used, charged := float64(e.model.usedBy("k")), e.charged("llm-tokens", "k")
	if used == 0 || charged < used {
		t.Fatalf("the model used %v tokens for the key, which was charged %v", used, charged)
	}
}

// The attack: Accept-Encoding: br or deflate, passed on to the upstream,
// has it answer in an encoding that was not read, and the request kept
// its estimate. The proxy asks the upstream for identity instead, reads
// the usage, and charges exactly what was used; the client gets an
// answer it can read.
func TestAttackSettleReencoded(t *testing.T) {
	e := newAttackEnv(t, mustPolicy(t, tokenPolicy), 1<<20, 0)
	body := `{"model":"m","max_tokens":1,"prompt":` + prompt(3000) + `}`
	for _, enc := range []string{"br", "deflate", "br, gzip", "deflate;q=1, br"} {
		if status := e.send("k", body, false, "Accept-Encoding", enc); status != 200 {
			t.Fatalf("Accept-Encoding %s: %d", enc, status)
		}
	}
	used, charged := float64(e.model.usedBy("k")), e.charged("llm-tokens", "k")
	if used != 4*3001 || charged != used {
		t.Fatalf("the model used %v tokens for the key, which was charged %v", used, charged)
	}
}

// The attack: a client that leaves a stream before its last event (which
// would state the usage). Before, the proxy's handler was aborted and
// nothing was settled: the request stayed charged max_tokens: 1. A stream
// cut short states no cost that can be trusted: it costs unsettled_cost.
func TestAttackSettleCutShort(t *testing.T) {
	e := newAttackEnv(t, mustPolicy(t, tokenPolicy), 1<<20, 0)
	body := `{"model":"m","max_tokens":1,"stream":true,"stream_options":{"include_usage":true},"prompt":` + prompt(5000) + `}`
	for range 5 {
		e.send("k", body, true)
	}
	used, charged := float64(e.model.usedBy("k")), e.charged("llm-tokens", "k")
	if used == 0 || charged < used {
		t.Fatalf("the model used %v tokens for the key, which was charged %v", used, charged)
	}
}

// A client that hangs up once it has read a stream to its "data: [DONE]"
// (as OpenAI's do), before the upstream has ended its body, read the
// whole stream: it is charged the usage stated, not unsettled_cost.
func TestProxySettlesStreamLeftAtDone(t *testing.T) {
	e := newAttackEnv(t, mustPolicy(t, tokenPolicy), 1<<20, 0)
	body := `{"model":"m","max_tokens":1,"stream":true,"stream_options":{"include_usage":true},"prompt":` + prompt(99) + `}`
	for range 3 {
		e.send("k", body, false, "X-Test-Linger", "1")
	}
	if used, charged := float64(e.model.usedBy("k")), e.charged("llm-tokens", "k"); used != 300 || charged != used {
		t.Fatalf("the model used %v tokens for the key, which was charged %v", used, charged)
	}
}

// The attack: 60 requests at once, each admitted on its 1-token estimate
// while the bucket is full, each using 10,000 tokens. Before, the debt
// was forgiven beyond one capacity: the key ended at -100,000 having
// used 600,000. The debt is carried in full: the bucket ends where the
// actual costs put it.
func TestAttackSettleDebtForgiven(t *testing.T) {
	const n = 60
	e := newAttackEnv(t, mustPolicy(t, tokenPolicy), 1<<20, n)
	body := `{"model":"m","max_tokens":1,"prompt":` + prompt(9999) + `}`
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.send("k", body, false)
		}()
	}
	wg.Wait()
	used, charged := float64(e.model.usedBy("k")), e.charged("llm-tokens", "k")
	if used != n*10000 || charged != used {
		t.Fatalf("the model used %v tokens for the key, which was charged %v", used, charged)
	}
}

// readmeLLMPolicy is the LLM example of docs/concepts.md's "Settlement",
// as written there.
func readmeLLMPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	md, err := os.ReadFile("../docs/concepts.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, _ := strings.Cut(string(md), "\n## Settlement\n")
	_, block, ok := strings.Cut(sec, "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("docs/concepts.md's Settlement has no yaml example")
	}
	return mustPolicy(t, block)
}

// The LLM example of docs/concepts.md, and examples/llm-gateway.yaml, are safe as
// written: whatever a key's clients do at once (streams without usage,
// streams left before their end, Accept-Encoding: br or deflate, plain
// requests, each declaring max_tokens: 1 and each using up to the
// model's context), starting from a full bucket on a clock that stands
// still, the key uses at most capacity + max_in_flight x context tokens,
// the bound they state, and is charged every token it used.
func TestAttackSettleReadmeExample(t *testing.T) {
	t.Run("docs/concepts.md", func(t *testing.T) { settleBound(t, readmeLLMPolicy(t), "llm-tokens", "llm-in-flight") })
	t.Run("examples/llm-gateway.yaml", func(t *testing.T) {
		data, err := os.ReadFile("../examples/llm-gateway.yaml")
		if err != nil {
			t.Fatal(err)
		}
		settleBound(t, mustPolicy(t, string(data)), "tokens-per-key", "in-flight-per-key")
	})
}

func settleBound(t *testing.T, p *policy.Policy, tokens, inFlightRule string) {
	const context = 128000 // the model's; the examples' unsettled_cost is at least this
	lim := p.Limit(tokens)
	inFlight := 0.0
	if c := p.Limit(inFlightRule); c != nil {
		inFlight = float64(c.MaxInFlight())
	}
	// The model holds the first requests until max_in_flight of them
	// have arrived: as many as may be in flight use the most they can
	// before any settles.
	e := newAttackEnv(t, p, context, max(1, int(inFlight)))
	kinds := []struct {
		body string
		cut  bool
		hdr  []string
	}{
		{`{"max_tokens":1,"stream":true,"prompt":` + prompt(context-1) + `}`, false, nil},
		{`{"max_tokens":1,"stream":true,"prompt":` + prompt(context-1) + `}`, true, nil},
		{`{"max_tokens":1,"prompt":` + prompt(context-1) + `}`, false, []string{"Accept-Encoding", "br"}},
		{`{"max_tokens":1,"stream":true,"prompt":` + prompt(context-1) + `}`, false, []string{"Accept-Encoding", "deflate"}},
		{`{"max_tokens":1,"prompt":` + prompt(context-1) + `}`, false, nil},
		{`{"max_tokens":1,"prompt":` + prompt(context) + `}`, false, nil}, // past the context: refused upstream, uses nothing
	}
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 6 {
				k := kinds[(g+i)%len(kinds)]
				e.send("k", k.body, k.cut, k.hdr...)
			}
		}()
	}
	wg.Wait()
	used, charged := float64(e.model.usedBy("k")), e.charged(tokens, "k")
	bound := lim.Capacity() + inFlight*context
	t.Logf("used %v, charged %v, bound %v", used, charged, bound)
	if inFlight == 0 || used > bound {
		t.Fatalf("the key used %v tokens, above capacity + max_in_flight x context = %v (max_in_flight %v)", used, bound, inFlight)
	}
	if charged < used {
		t.Fatalf("the key used %v tokens and was charged %v", used, charged)
	}
}

// stream_usage: include asks an OpenAI-style stream for its usage: a
// JSON body with "stream": true reaches the upstream with
// stream_options.include_usage set, its other members as sent and in
// order, and a Content-Length that is the new body's. A body that asks
// for no stream, has the option already, or could be read two ways
// (a member named twice) goes on as it came. The upstream is asked for
// identity, whatever the client accepts.
func TestProxyStreamUsage(t *testing.T) {
	type seen struct {
		body, encoding string
		length         int64
	}
	got := make(chan seen, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{string(b), r.Header.Get("Accept-Encoding"), r.ContentLength}
		io.WriteString(w, `{"usage":{"total_tokens":3}}`)
	}))
	t.Cleanup(up.Close)
	e := newEnv(t, strings.Replace(tokenPolicy, `settle_from: "body:usage.total_tokens"`, `settle_from: "body:usage.total_tokens"
      stream_usage: include`, 1))
	upURL, _ := url.Parse(up.URL)
	proxy := serve(t, e.gate.Proxy(upURL, httpgate.ProxyOptions{}))
	for _, c := range []struct{ in, want string }{
		{`{"model":"m","stream":true,"max_tokens":5}`, `{"model":"m","stream":true,"max_tokens":5,"stream_options":{"include_usage":true}}`},
		{`{"stream": true, "stream_options": {"x": [1, 2]}, "n": 1}`, `{"stream":true,"stream_options":{"x":[1, 2],"include_usage":true},"n":1}`},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":null}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"<\u0061>": "<é>", "stream" : true}`, `{"<\u0061>":"<é>","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{"include_usage":true}}`, ""},
		{`{"stream":false}`, ""},
		{`{"stream":"true"}`, ""},
		{`{"stream":true,"stream":false}`, ""},
		{`{"stream":true,"stream_options":{"include_usage":false,"include_usage":false}}`, ""},
		{`{"stream":true} {}`, ""},
		{`[{"stream":true}]`, ""},
	} {
		want := c.want
		if want == "" {
			want = c.in
		}
		call(t, proxy, "/v1/chat/completions", c.in, "X-Api-Key", "k", "Accept-Encoding", "br")
		s := <-got
		if s.body != want || s.length != int64(len(want)) || s.encoding != "identity" {
			t.Errorf("%s: the upstream read %s (Content-Length %d, Accept-Encoding %q), want %s", c.in, s.body, s.length, s.encoding, want)
		}
	}
}

// Attack: a client upgrades a request that a settled limit charged (a
// websocket, as realtime model APIs take) and uses the upstream over the
// upgraded connection for as long as it likes: no cost is read from it,
// and the request is charged unsettled_cost once, which no longer bounds
// what one request uses. The upgrade is not passed on: the upstream
// answers the request as a plain one.
func TestAttackUpgradeEscapesSettlement(t *testing.T) {
	e := newEnv(t, llmPolicy)
	var upgraded atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want Upgrade: echo", http.StatusUpgradeRequired)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		upgraded.Add(1)
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(conn, brw)
	}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	proxy := serve(t, e.gate.Proxy(upURL, httpgate.ProxyOptions{}))
	for _, path := range []string{"/v1/realtime", "/plain/ws"} {
		conn, err := net.Dial("tcp", proxy.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\nX-Api-Key: k\r\n\r\n", path)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		<-proxy.done
		settled := path == "/v1/realtime"
		if got := resp.StatusCode == http.StatusSwitchingProtocols; got == settled {
			t.Errorf("%s: %d, want an upgrade only where no limit settles", path, resp.StatusCode)
		}
	}
	if upgraded.Load() != 1 {
		t.Errorf("the upstream upgraded %d connections, want 1 (the unsettled path's)", upgraded.Load())
	}
}
