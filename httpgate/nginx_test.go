package httpgate_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/internal/proxytest"
)

// TestNginxAuthRequest runs examples/nginx.conf in a real nginx in front of
// an upstream, with sluice's forward auth as its auth_request: a client
// over its limit gets a 429 with Retry-After and the RateLimit fields, and
// the upstream never sees the rejected requests.
func TestNginxAuthRequest(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: nginx}\n"+tightPolicy)
	var hits atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "app: "+r.URL.Path)
	}))
	t.Cleanup(app.Close)
	addr, logs := startNginx(t, e, app)

	get := func() (*http.Response, string) { return getOrder(t, addr) }
	for i := 0; i < 2; i++ {
		resp, body := get()
		if resp.StatusCode != 200 || body != "app: /orders" {
			t.Fatalf("request %d: %d %q\n%s", i, resp.StatusCode, body, logs())
		}
		if rl := resp.Header.Get("RateLimit"); rl == "" {
			t.Errorf("allowed request %d without RateLimit: %v", i, resp.Header)
		}
	}
	resp, body := get()
	if resp.StatusCode != 429 {
		t.Fatalf("third request: %d %q\n%s", resp.StatusCode, body, logs())
	}
	wantProxiedRejection(t, e, resp, body, hits.Load())
}

// startNginx runs examples/nginx.conf in a real nginx, with e's forward
// auth as its auth_request and app as its upstream, and returns the
// address it listens on and a function that reads its logs.
func startNginx(t *testing.T, e *env, app *httptest.Server) (addr string, logs func() string) {
	t.Helper()
	conf, err := os.ReadFile("../examples/nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	addr = proxytest.FreeAddr(t)
	cfg := proxytest.Rewrite(t, "examples/nginx.conf", string(conf),
		[2]string{"127.0.0.1:8080;", strings.TrimPrefix(e.srv.URL, "http://") + ";"},
		[2]string{"127.0.0.1:3000;", strings.TrimPrefix(app.URL, "http://") + ";"},
		[2]string{"listen 127.0.0.1:8000;", "listen " + addr + ";"},
	)
	return addr, proxytest.Nginx(t, cfg, addr)
}

// wantProxiedRejection checks the third request through a real proxy in
// front of sluice's forward auth (tightPolicy: 2 per client): sluice's 429
// with every rate limit field, an upstream that saw only the 2 admitted
// requests, and an audit record of the original request.
func wantProxiedRejection(t *testing.T, e *env, resp *http.Response, body string, appHits int64) {
	t.Helper()
	wantHeaders(t, resp.Header, map[string]string{
		"Retry-After":         "1",
		"RateLimit-Policy":    `"per-ip";q=2;w=2`,
		"RateLimit":           `"per-ip";r=0;t=1`,
		"RateLimit-Limit":     "2",
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     "1",
		"X-Sluice-Reason":     "token_bucket_exceeded",
		"Cache-Control":       "no-store",
		"Content-Type":        "application/problem+json",
	})
	if !strings.Contains(body, "quota-exceeded") {
		t.Errorf("body %q", body)
	}
	if appHits != 2 {
		t.Errorf("the app saw %d requests, want 2: rejected requests must not reach it", appHits)
	}
	// sluice judged the original request: the client's address and path.
	if a := e.audit.String(); !strings.Contains(a, `"path":"/orders"`) || !strings.Contains(a, `"client_ip":"127.0.0.1"`) {
		t.Errorf("audit log %q", a)
	}
}

// getOrder asks a proxy in front of the app for /orders, as the proxy
// tests' client does.
func getOrder(t *testing.T, addr string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/orders?id=7")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// Attack (through a real nginx running examples/nginx.conf): the client
// sends every forwarding header it can think of, X-Original-URI and
// X-Real-IP included, and spells /login every other way. nginx replaces
// or drops them, and sluice reads only nginx's: three logins per client,
// then 429s, with the client's real address.
func TestAttackNginxForgedHeaders(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: nginx}\n"+loginRules)
	addr, logs := startNginx(t, e, newApp(t))
	attackThroughProxy(t, e, addr, logs)
}

// Attack (through a real nginx running examples/nginx.conf): the client
// writes its login as "/login#/../xN". nginx routes it as /login and
// passes it on as sent, and an upstream that reads the target as a URI
// reference (Go's url.Parse, Node's url.parse, which Express routes by)
// serves /login; X-Original-URI carries it whole, and read as a path it
// was /xN, out of the login rule and a fresh bucket each time. What
// follows '#' is a fragment, never the path: three logins, then 429s.
func TestAttackNginxFragmentHidesPath(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: nginx}\n"+loginRules)
	var logins atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, err := url.Parse(r.RequestURI); err == nil && u.Path == "/login" {
			logins.Add(1)
		}
	}))
	t.Cleanup(app.Close)
	addr, logs := startNginx(t, e, app)
	got := statuses(t, 5, func(i int) int {
		resp, _ := rawRequest(t, addr, "POST", fmt.Sprintf("/login#/../x%d", i))
		return resp.StatusCode
	})
	if got != "200 200 200 429 429" || logins.Load() != 3 {
		t.Fatalf("five POSTs to /login#/../xN: %s, the app served /login %d times; want 200 200 200 429 429 and 3\naudit: %s\n%s", got, logins.Load(), e.audit.String(), logs())
	}
}
