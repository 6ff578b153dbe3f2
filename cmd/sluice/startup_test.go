package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/lockedbuf"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/serverconf"
)

// held returns a loopback address another listener holds until the test
// ends.
func held(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// serveExit runs serve with args, which must fail at start, and returns
// its exit code and output.
func serveExit(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var logs lockedbuf.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := serve(ctx, args, &logs, func(listening) { t.Errorf("serve started: %v", args) })
	return code, logs.String()
}

// A port in use: serve used to announce "listening" on the HTTP
// listener and then die on the gRPC default, with nothing to say which
// setting held that address. Every listener is bound before any is
// announced, and a failure names the setting or flag it came from and
// how to change it.
func TestServeBindsEveryListenerFirst(t *testing.T) {
	busy := held(t)
	code, out := serveExit(t, "--listen", "127.0.0.1:0", "--grpc-listen", busy)
	want := fmt.Sprintf(`sluice serve: --grpc-listen %s: address already in use (set grpc_listen or --grpc-listen to another address, or "" / off to turn the Envoy service off)`, busy)
	if code != 1 || !strings.Contains(out, want) {
		t.Errorf("exit %d, output:\n%s\nwant the line %q", code, out, want)
	}
	if strings.Contains(out, "listening") {
		t.Errorf("serve announced a listener it then dropped:\n%s", out)
	}

	// From the file: the setting is named.
	cfg := writePolicy(t, `
listen: "127.0.0.1:0"
grpc_listen: ""
proxy:
  listen: "`+busy+`"
  upstream: "http://127.0.0.1:9"
rules:
  - name: a
    algorithm_config: {rps: 1, burst: 1}
`)
	code, out = serveExit(t, "--config", cfg)
	want = fmt.Sprintf("sluice serve: proxy.listen %s: address already in use (set proxy.listen or --proxy-listen to another address)", busy)
	if code != 1 || !strings.Contains(out, want) || strings.Contains(out, "listening") {
		t.Errorf("exit %d, output:\n%s\nwant the line %q and no listening", code, out, want)
	}
}

// A grpc_listen nobody wrote, derived from listen, says so.
func TestListenerOrigin(t *testing.T) {
	rs := withFlags(defaultSettings(t), serveFlags{})
	for _, l := range rs.listeners() {
		if l.setting == "grpc_listen" {
			if got := rs.origin(l); got != "grpc_listen (by default listen's host, port 8081)" {
				t.Errorf("origin %q", got)
			}
		}
	}
}

// serverSettings are the server's settings of the config file at path,
// in either format.
func serverSettings(t *testing.T, path string) serverconf.Settings {
	t.Helper()
	cf, _, err := loadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	return cf.Server()
}

func defaultSettings(t *testing.T) runSettings {
	t.Helper()
	cf, p, err := loadPolicy("")
	if err != nil {
		t.Fatal(err)
	}
	return fileSettings(cf.Server(), p)
}

// sluice check used to pass a file that serve then refused: an audit
// log in a directory that does not exist (examples/policy.yaml's
// /var/log/sluice on a fresh machine), a store URL whose parameters only
// the store's open reads. Both now check the same things, with the same
// message, and check creates nothing.
func TestCheckCatchesWhatServeRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, config, want string
	}{
		{"audit log directory", "audit_log: " + filepath.Join(dir, "missing", "audit.jsonl") + "\n",
			"audit_log: directory " + filepath.Join(dir, "missing") + " does not exist"},
		{"audit log is a directory", "audit_log: " + dir + "\n", "audit_log: " + dir + " is not a regular file"},
		{"redis parameter", "store: {url: \"redis://127.0.0.1:1/0?batch=maybe\"}\n", "store.url: redis store url redis://127.0.0.1:1/0?batch=maybe: batch must be 0 or 1"},
		{"postgres parameter", "store: {url: \"postgres://db/app?pool_max_conns=lots\"}\n", "store.url: postgres url:"},
		{"unknown store", "store: {url: \"mysql://db/app\"}\n", `store.url: unknown store "mysql"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writePolicy(t, "listen: \"127.0.0.1:0\"\ngrpc_listen: \"\"\n"+tc.config+"rules:\n  - name: a\n    algorithm_config: {rps: 1, burst: 1}\n")
			var out, errb bytes.Buffer
			if code := run([]string{"check", cfg}, &out, &errb); code != 1 || !strings.Contains(errb.String(), cfg+": "+tc.want) {
				t.Errorf("check: exit %d, stderr %q, want %q", code, errb.String(), cfg+": "+tc.want)
			}
			code, log := serveExit(t, "--config", cfg)
			if code != 1 || !strings.Contains(log, "sluice serve: "+cfg+": "+tc.want) {
				t.Errorf("serve: exit %d, output:\n%s\nwant %q", code, log, tc.want)
			}
		})
	}

	// A writable directory passes, and check leaves no file behind.
	audit := filepath.Join(dir, "audit.jsonl")
	cfg := writePolicy(t, "audit_log: "+audit+"\nrules:\n  - name: a\n    algorithm_config: {rps: 1, burst: 1}\n")
	var out, errb bytes.Buffer
	if code := run([]string{"check", cfg}, &out, &errb); code != 0 {
		t.Fatalf("check: exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(audit); !os.IsNotExist(err) {
		t.Errorf("check created the audit log: %v", err)
	}

	// An address given by a flag is checked too, and named by its flag.
	code, log := serveExit(t, "--listen", "8080", "--grpc-listen", "off")
	if code != 1 || !strings.Contains(log, `sluice serve: --listen: must be an address such as ":8080" or "127.0.0.1:8080" (got "8080")`) {
		t.Errorf("serve --listen 8080: exit %d, output:\n%s", code, log)
	}
}

// A store that does not answer at start: serve used to exit 1 on a
// refused Redis connection although on_store_error: allow would serve.
// It starts as it would ride out a later outage: each rule's
// on_store_error decides and /readyz fails until the store answers; then
// /readyz passes and Redis decides.
func TestServeStartsWithoutItsStore(t *testing.T) {
	oldMin, oldMax := storeRetryMin, storeRetryMax
	storeRetryMin, storeRetryMax = 10*time.Millisecond, 100*time.Millisecond
	t.Cleanup(func() { storeRetryMin, storeRetryMax = oldMin, oldMax })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	cfg := writePolicy(t, `
store: {url: "redis://`+addr+`/0"}
rules:
  - name: open
    algorithm_config: {rate: 1, period: 1h, capacity: 1}
    on_store_error: allow
  - name: closed
    algorithm_config: {rate: 1, period: 1h, capacity: 1}
    on_store_error: deny
`)
	l, logs := startServe(t, "--config", cfg)
	if !strings.Contains(logs.String(), "the store did not answer at start") {
		t.Errorf("the degraded start is not logged:\n%s", logs.String())
	}
	if code := readyz(t, l.API); code != 503 {
		t.Errorf("/readyz %d while the store is down, want 503", code)
	}
	for i := 0; i < 3; i++ {
		if d := take(t, l.API, `{"rule":"open","key":"k"}`); d["allowed"] != true || d["store_error"] != true {
			t.Fatalf("open rule, store down: %v", d)
		}
		if d := take(t, l.API, `{"rule":"closed","key":"k"}`); d["allowed"] != false || d["store_error"] != true {
			t.Fatalf("closed rule, store down: %v", d)
		}
	}

	redistest.ServerOn(t, addr)
	for deadline := time.Now().Add(30 * time.Second); readyz(t, l.API) != 200; {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never passed once Redis was up:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond) // waiting for the reconnection, not for tokens
	}
	// Redis decides now: a capacity of 1 (an hour to refill) admits one.
	if d := take(t, l.API, `{"rule":"open","key":"k"}`); d["allowed"] != true || d["store_error"] != nil {
		t.Fatalf("first take from Redis: %v", d)
	}
	if d := take(t, l.API, `{"rule":"open","key":"k"}`); d["allowed"] != false || d["store_error"] != nil {
		t.Fatalf("second take from Redis: %v", d)
	}
}

// serve names a Redis eviction policy under which a client minting keys
// refills drained buckets or fails every take to on_store_error
// (redis.TestAttackKeyFloodEvictsDrainedBuckets).
func TestServeWarnsOfRedisEvictionPolicy(t *testing.T) {
	p := redistest.New(t, "--maxmemory-policy", "allkeys-lru")
	cfg := writePolicy(t, `
store: {url: "redis://`+p.Addr()+`/0"}
rules:
  - name: r
    algorithm_config: {rate: 1, period: 1h, capacity: 1}
`)
	_, logs := startServe(t, "--config", cfg)
	if !strings.Contains(logs.String(), "maxmemory-policy is allkeys-lru") {
		t.Errorf("the eviction policy is not named:\n%s", logs.String())
	}
}

// PostgreSQL's pool connects on demand, so only migrations need the
// server at start: with sluice_migrate=true and no server, serve starts
// as it does without Redis, and retries the opening (migrations included).
func TestServeStartsWithoutPostgres(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := writePolicy(t, `
store: {url: "postgres://sluice@`+addr+`/sluice?sslmode=disable&sluice_migrate=true"}
rules:
  - name: open
    algorithm_config: {rate: 1, period: 1h, capacity: 1}
    on_store_error: allow
`)
	l, logs := startServe(t, "--config", cfg)
	if !strings.Contains(logs.String(), "the store did not answer at start") {
		t.Errorf("the degraded start is not logged:\n%s", logs.String())
	}
	if code := readyz(t, l.API); code != 503 {
		t.Errorf("/readyz %d while the store is down, want 503", code)
	}
	if d := take(t, l.API, `{"rule":"open","key":"k"}`); d["allowed"] != true || d["store_error"] != true {
		t.Fatalf("open rule, store down: %v", d)
	}
}

func readyz(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
