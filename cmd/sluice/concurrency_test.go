package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// Two sluice processes on one Redis proxy one upstream with a concurrency
// rule: the slots are the fleet's, not each process's. The store's
// deadline is one no loaded machine reaches: the test is about slots, and
// a call that misses serve's default deadline answers 504.
func TestServeRedisFleetConcurrency(t *testing.T) {
	testFleetConcurrency(t, "redis://"+redistest.Server(t)+"/0?timeout=1m&dial_timeout=30s&write_timeout=30s")
}

// testFleetConcurrency runs two serve processes on the store at storeURL,
// both proxying to one upstream that holds every request until the test
// lets go. Of N+1 requests through either proxy, exactly N reach the
// upstream and one is refused; once they end every slot is free; and a
// lease taken through the decision API and never released (its holder
// died) holds its slot on every process until its lease ends.
func testFleetConcurrency(t *testing.T, storeURL string) {
	var in atomic.Int64
	arrived, release := make(chan struct{}, 16), make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.Add(1)
		defer in.Add(-1)
		arrived <- struct{}{}
		select {
		case <-release:
			io.WriteString(w, "app")
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(app.Close)
	const n, lease = 3, time.Second
	cfg := writePolicy(t, fmt.Sprintf(`store:
  url: %s
proxy:
  listen: 127.0.0.1:0
  upstream: %s
rules:
  - name: inflight
    algorithm: concurrency
    limit_keys: ["header:x-api-key"]
    algorithm_config: {max_in_flight: %d, lease: %v}
`, strconv.Quote(storeURL), app.URL, n, lease))
	a, _ := startServe(t, "--config", cfg)
	b, _ := startServe(t, "--config", cfg)
	get := func(proxy string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+proxy+"/x", nil)
		req.Header.Set("X-Api-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return -1, err.Error()
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("X-Sluice-Reason")
	}
	free := func() float64 { // the slots free, as a peek on a sees them
		m := peek(t, a.API, `{"rule":"inflight","key":"k1"}`)
		if m["allowed"] != true {
			return 0
		}
		return m["remaining"].(float64) + 1
	}
	waitFree := func(want float64) {
		for deadline := time.Now().Add(10 * time.Second); free() != want; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%v slots free 10s after the requests ended, want %v", free(), want)
			}
		}
	}

	type result struct {
		code   int
		reason string
	}
	results := make(chan result, n+1)
	for i := range n + 1 {
		proxy := a.Proxy
		if i%2 == 1 {
			proxy = b.Proxy
		}
		go func() {
			code, reason := get(proxy)
			results <- result{code, reason}
		}()
	}
	if r := <-results; r.code != 429 || r.reason != "concurrency_exceeded" {
		t.Fatalf("the request beyond max_in_flight: %+v, want 429 concurrency_exceeded", r)
	}
	for range n {
		<-arrived
	}
	if got := in.Load(); got != n {
		t.Fatalf("%d requests in the upstream, want %d", got, n)
	}
	close(release)
	for range n {
		if r := <-results; r.code != 200 {
			t.Fatalf("an admitted request: %+v", r)
		}
	}
	waitFree(n)

	// Every slot taken through a's decision API by holders that die.
	start := time.Now()
	for range n {
		if d := take(t, a.API, `{"rule":"inflight","key":"k1"}`); d["allowed"] != true || d["lease"] == nil {
			t.Fatalf("take: %v", d)
		}
	}
	if code, reason := get(b.Proxy); code != 429 || reason != "concurrency_exceeded" {
		t.Fatalf("through b while a's leases run: %d %s, want 429", code, reason)
	}
	// Waiting for a lease to end, not for tokens: the store's own clock
	// ends it.
	for {
		code, _ := get(b.Proxy)
		if code == 200 {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the dead holders' slots are still held 10s after a %v lease", lease)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if since := time.Since(start); since < lease {
		t.Fatalf("a slot came back %v after its take, before its %v lease ended", since, lease)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"check", cfg}, &out, &errb); code != 0 {
		t.Fatalf("sluice check: %d %s", code, errb.String())
	}
}
