package httpgate_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
)

// upstream counts the requests it sees and serves /stream (an event
// stream that waits for the test between events) and /ws (an Upgrade that
// echoes bytes).
type upstream struct {
	*httptest.Server
	hits    atomic.Int64
	release chan struct{}
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		switch r.URL.Path {
		case "/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
			fmt.Fprint(w, "data: two\n\n")
		case "/slow":
			<-r.Context().Done() // never answers; the proxy gives up
		case "/ws":
			if r.Header.Get("Upgrade") != "echo" {
				http.Error(w, "want Upgrade: echo", 400)
				return
			}
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			brw.Flush()
			io.Copy(conn, brw)
		default:
			w.Header().Set("X-Upstream", "yes")
			fmt.Fprintf(w, "hello %s xff=%s conn=%q", r.URL.Path, r.Header.Get("X-Forwarded-For"), r.Header.Get("Connection"))
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func TestReverseProxy(t *testing.T) {
	up := newUpstream(t)
	e := newEnv(t, tightPolicy)
	upURL, _ := url.Parse(up.URL)
	proxy := httptest.NewServer(e.gate.Proxy(upURL, httpgate.ProxyOptions{}))
	t.Cleanup(proxy.Close)

	get := func(path string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", proxy.URL+path, nil)
		req.Header.Set("X-Forwarded-For", "192.0.2.44")
		req.Header.Set("Connection", "keep-alive, X-Secret")
		req.Header.Set("X-Secret", "hop-by-hop")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("/hello")
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "hello /hello") || resp.Header.Get("X-Upstream") != "yes" {
		t.Fatalf("allowed: %d %q", resp.StatusCode, body)
	}
	// The trusted peer's X-Forwarded-For is extended; hop-by-hop headers
	// stop at the proxy.
	if !strings.Contains(body, "xff=192.0.2.44, 127.0.0.1") || !strings.Contains(body, `conn=""`) {
		t.Errorf("upstream saw %q", body)
	}
	wantHeaders(t, resp.Header, map[string]string{"RateLimit": `"per-ip";r=1;t=1`, "RateLimit-Remaining": "1"})
	get("/hello")
	resp, body = get("/hello")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, "quota-exceeded") {
		t.Fatalf("rejected: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	if n := up.hits.Load(); n != 2 {
		t.Errorf("upstream saw %d requests, want 2: rejected ones must not reach it", n)
	}

	// An unreachable upstream is a 502 problem.
	dead, _ := url.Parse("http://127.0.0.1:1")
	bad := httptest.NewServer(e.gate.Proxy(dead, httpgate.ProxyOptions{DialTimeout: time.Second}))
	t.Cleanup(bad.Close)
	e.clk.Advance(time.Minute)
	r2, err := http.Get(bad.URL + "/x")
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != 502 || r2.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("dead upstream: %d %q", r2.StatusCode, r2.Header.Get("Content-Type"))
	}

	// An upstream that does not answer in time is a 504.
	slow := httptest.NewServer(e.gate.Proxy(upURL, httpgate.ProxyOptions{ResponseHeaderTimeout: 50 * time.Millisecond}))
	t.Cleanup(slow.Close)
	e.clk.Advance(time.Minute)
	r3, err := http.Get(slow.URL + "/slow")
	if err != nil {
		t.Fatal(err)
	}
	r3.Body.Close()
	if r3.StatusCode != 504 {
		t.Errorf("slow upstream: %d", r3.StatusCode)
	}
}

func TestReverseProxyStreamsAndUpgrades(t *testing.T) {
	up := newUpstream(t)
	e := newEnv(t, `
rules:
  - name: global
    algorithm: token_bucket
    algorithm_config: {rps: 100, burst: 100}
`)
	upURL, _ := url.Parse(up.URL)
	proxy := httptest.NewServer(e.gate.Proxy(upURL, httpgate.ProxyOptions{}))
	t.Cleanup(proxy.Close)

	// The first event arrives while the upstream still holds the stream
	// open: nothing is buffered.
	resp, err := http.Get(proxy.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	close(up.release)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "data: two") {
		t.Errorf("rest of stream %q", rest)
	}

	// An Upgrade passes through and the connection becomes a byte pipe.
	conn, err := net.Dial("tcp", strings.TrimPrefix(proxy.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	cr := bufio.NewReader(conn)
	r, err := http.ReadResponse(cr, nil)
	if err != nil || r.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", r, err)
	}
	if r.Header.Get("RateLimit") == "" {
		t.Errorf("upgrade response without RateLimit: %v", r.Header)
	}
	fmt.Fprint(conn, "ping\n")
	echo, err := cr.ReadString('\n')
	if err != nil || echo != "ping\n" {
		t.Errorf("echo %q %v", echo, err)
	}
}

func TestMiddleware(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	lim := sluice.New(memory.New(memory.Options{Clock: clk}))
	var hits atomic.Int64
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "ok")
	})
	reg := prometheus.NewRegistry()
	mw := httpgate.Middleware(mustPolicy(t, tightPolicy), lim, httpgate.Options{Metrics: metrics.New(reg)})
	srv := httptest.NewServer(mw(next))
	t.Cleanup(srv.Close)

	var last *http.Response
	for i := 0; i < 3; i++ {
		resp, err := http.Get(srv.URL + "/anything")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if i < 2 && (resp.StatusCode != 200 || resp.Header.Get("RateLimit") != fmt.Sprintf(`"per-ip";r=%d;t=%d`, 1-i, i+1)) {
			t.Errorf("request %d: %d %q", i, resp.StatusCode, resp.Header.Get("RateLimit"))
		}
		last = resp
	}
	wantHeaders(t, last.Header, map[string]string{
		"Retry-After":         "1",
		"X-Sluice-Reason":     "token_bucket_exceeded",
		"RateLimit":           `"per-ip";r=0;t=1`,
		"RateLimit-Remaining": "0",
		"Content-Type":        "application/problem+json",
	})
	if last.StatusCode != 429 || hits.Load() != 2 {
		t.Errorf("third request: %d; handler ran %d times", last.StatusCode, hits.Load())
	}
	clk.Advance(time.Second)
	if resp, _ := http.Get(srv.URL + "/"); resp.StatusCode != 200 {
		t.Errorf("after a second: %d", resp.StatusCode)
	}
}
