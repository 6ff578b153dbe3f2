package httpgate_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/lockedbuf"
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
	bin := serverBinary(t, "caddy", "/usr/bin/caddy")
	conf, err := os.ReadFile("../examples/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	addr = freePort(t)
	cfg := string(conf)
	for old, new := range map[string]string{
		":8000 {":                        "http://" + addr + " {",
		"forward_auth 127.0.0.1:8080 {":  "forward_auth " + strings.TrimPrefix(e.srv.URL, "http://") + " {",
		"reverse_proxy 127.0.0.1:3000\n": "reverse_proxy " + strings.TrimPrefix(app.URL, "http://") + "\n",
	} {
		if !strings.Contains(cfg, old) {
			t.Fatalf("examples/Caddyfile no longer contains %q", old)
		}
		cfg = strings.Replace(cfg, old, new, 1)
	}
	// Global options: no admin endpoint, no certificates, storage in dir
	// (HOME and XDG_* below keep the autosaved config there too). The
	// global block must come first; comments may precede it.
	cfg = "{\n\tadmin off\n\tauto_https off\n\tstorage file_system " +
		filepath.Join(dir, "data") + "\n}\n\n" + cfg
	confPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(confPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	out := &lockedbuf.Buffer{}
	cmd := exec.CommandContext(ctx, bin, "run", "--config", confPath, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"HOME="+dir,
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
	)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) } // graceful stop
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start caddy: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
	})
	waitListening(t, "caddy", addr, func() bool {
		select {
		case <-exited:
			return true
		default:
			return false
		}
	}, out.String)
	return addr, out.String
}

// Attack (through a real Caddy running examples/Caddyfile): the same as
// through nginx.
func TestAttackCaddyForgedHeaders(t *testing.T) {
	e := newEnv(t, "forward_auth: {proxy: caddy}\n"+loginRules)
	addr, logs := startCaddy(t, e, newApp(t))
	attackThroughProxy(t, e, addr, logs)
}
