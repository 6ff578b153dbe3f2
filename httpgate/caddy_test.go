package httpgate_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/internal/proxytest"
)

// TestCaddyForwardAuth runs examples/Caddyfile in a real Caddy in front of
// an upstream, with sluice's forward auth as its forward_auth target: a
// client over its limit gets sluice's 429 with Retry-After and the
// RateLimit fields, and the upstream never sees the rejected requests.
func TestCaddyForwardAuth(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: caddy}\n"+tightPolicy)
	var (
		hits    atomic.Int64
		mu      sync.Mutex
		appSeen []http.Header // the headers of the requests the app served
	)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		mu.Lock()
		appSeen = append(appSeen, r.Header.Clone())
		mu.Unlock()
		io.WriteString(w, "app: "+r.URL.Path)
	}))
	t.Cleanup(app.Close)

	addr, logs := startCaddy(t, e, app)

	get := func() (*http.Response, string) { return getOrder(t, addr) }
	for i := 0; i < 2; i++ {
		resp, body := get()
		if resp.StatusCode != 200 || body != "app: /orders" {
			t.Fatalf("request %d: %d %q\n%s", i, resp.StatusCode, body, logs())
		}
	}
	// copy_headers hands sluice's view of allowed requests to the app.
	mu.Lock()
	for i, h := range appSeen {
		if h.Get("RateLimit") == "" || h.Get("RateLimit-Policy") == "" || h.Get("RateLimit-Remaining") == "" {
			t.Errorf("app request %d without sluice's RateLimit fields: %v", i, h)
		}
	}
	mu.Unlock()

	resp, body := get()
	if resp.StatusCode != 429 {
		t.Fatalf("third request: %d %q\n%s", resp.StatusCode, body, logs())
	}
	wantProxiedRejection(t, e, resp, body, hits.Load())
}

// startCaddy runs examples/Caddyfile in a real Caddy, with e's forward
// auth as its forward_auth target and app as its upstream, and returns the
// address it listens on and a function that reads its logs.
func startCaddy(t *testing.T, e *env, app *httptest.Server) (addr string, logs func() string) {
	t.Helper()
	conf, err := os.ReadFile("../examples/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	addr = proxytest.FreeAddr(t)
	cfg := proxytest.Rewrite(t, "examples/Caddyfile", string(conf),
		[2]string{":8000 {", "http://" + addr + " {"},
		[2]string{"forward_auth 127.0.0.1:8080 {", "forward_auth " + strings.TrimPrefix(e.srv.URL, "http://") + " {"},
		[2]string{"reverse_proxy 127.0.0.1:3000\n", "reverse_proxy " + strings.TrimPrefix(app.URL, "http://") + "\n"},
	)
	return addr, proxytest.Caddy(t, cfg, addr)
}

// Attack (through a real Caddy running examples/Caddyfile): the same as
// through nginx.
func TestAttackCaddyForgedHeaders(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: caddy}\n"+loginRules)
	addr, logs := startCaddy(t, e, newApp(t))
	attackThroughProxy(t, e, addr, logs)
}
