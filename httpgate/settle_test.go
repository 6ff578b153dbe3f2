package httpgate_test

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
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
	// 1490 more: 970 - 10 - 1490 is 530 in debt, and the debt bound is
	// one capacity (1000): all of it is charged.
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
