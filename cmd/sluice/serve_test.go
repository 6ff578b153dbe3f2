package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/lockedbuf"
)

// startServe runs serve with args until the test ends and returns its
// addresses and log. The decision API listens on a free loopback port and
// the gRPC service is off unless args say otherwise.
func startServe(t *testing.T, args ...string) (listening, *lockedbuf.Buffer) {
	t.Helper()
	return startServeArgs(t, append([]string{"--listen", "127.0.0.1:0", "--grpc-listen", "off"}, args...)...)
}

// startServeArgs is startServe with exactly args.
func startServeArgs(t *testing.T, args ...string) (listening, *lockedbuf.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &lockedbuf.Buffer{}
	readyc := make(chan listening, 1)
	exited := make(chan struct{})
	var code int
	go func() {
		defer close(exited)
		// No drain: a test's server has no load balancer to tell.
		code = serve(ctx, append([]string{"--shutdown-drain", "0"}, args...), logs, func(l listening) { readyc <- l })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			t.Errorf("serve did not shut down:\n%s", logs.String())
		}
	})
	select {
	case l := <-readyc:
		t.Cleanup(func() {
			cancel()
			select {
			case <-exited:
				if code != 0 {
					t.Errorf("serve exited %d:\n%s", code, logs.String())
				}
			case <-time.After(15 * time.Second):
				t.Errorf("serve did not shut down:\n%s", logs.String())
			}
		})
		return l, logs
	case <-exited:
		t.Fatalf("serve exited %d:\n%s", code, logs.String())
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not start:\n%s", logs.String())
	}
	return listening{}, nil
}

func take(t *testing.T, addr, body string) map[string]any { return decide(t, addr, "take", body) }

func peek(t *testing.T, addr, body string) map[string]any { return decide(t, addr, "peek", body) }

// decide posts body to the decision API's /v1/OP and decodes the answer.
func decide(t *testing.T, addr, op, body string) map[string]any {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/"+op, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestServeEmbeddedDefault(t *testing.T) {
	l, logs := startServe(t)
	if !strings.Contains(logs.String(), "listening") || !strings.Contains(logs.String(), l.API) {
		t.Errorf("serve did not log where it listens:\n%s", logs.String())
	}
	// Per-IP token bucket, burst 20.
	var last *http.Response
	for i := 0; i < 21; i++ {
		resp, err := http.Get("http://" + l.API + "/v1/auth")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if i < 20 && resp.StatusCode != 200 {
			// Refill at 10/s can only help; a rejection this early is a bug.
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		last = resp
	}
	// 21 requests within well under 100ms exceed the burst.
	if last.StatusCode != 429 || last.Header.Get("Retry-After") == "" || last.Header.Get("RateLimit-Limit") != "20" {
		t.Logf("21st request: %d %v (slow machine: the bucket refilled)", last.StatusCode, last.Header)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get("http://" + l.API + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d", p, resp.StatusCode)
		}
		if p == "/metrics" && (!strings.Contains(string(b), `sluice_decisions_total{result="allowed",rule="per-ip"}`) || !strings.Contains(string(b), "sluice_live_keys 1")) {
			t.Errorf("metrics:\n%s", b)
		}
	}
}

const reloadV1 = `
rules:
  - name: hourly
    algorithm: token_bucket
    algorithm_config: {rate: 3, period: 1h}
  - name: other
    algorithm: token_bucket
    algorithm_config: {rate: 5, period: 1h}
`

func reloads(t *testing.T, addr string) (ok, failed int) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		var n int
		if _, err := fmtSscan(line, `sluice_config_reloads_total{result="success"} `, &n); err == nil {
			ok = n
		}
		if _, err := fmtSscan(line, `sluice_config_reloads_total{result="failure"} `, &n); err == nil {
			failed = n
		}
	}
	return ok, failed
}

func fmtSscan(line, prefix string, n *int) (int, error) {
	rest, found := strings.CutPrefix(line, prefix)
	if !found {
		return 0, os.ErrNotExist
	}
	return 1, json.Unmarshal([]byte(rest), n)
}

// waitReloads polls until the reload counters reach want: the file is
// polled in the background, so this waits on serve, not on tokens.
func waitReloads(t *testing.T, addr string, wantOK, wantFailed int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, failed := reloads(t, addr)
		if ok == wantOK && failed == wantFailed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("reloads: %d ok, %d failed; want %d, %d", ok, failed, wantOK, wantFailed)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// replaceFile puts data at path as a config tool does: written aside and
// renamed over it, so that no poll finds it half written. (A file written
// in place is applied once two polls agree; with the test's 10ms polls, a
// writer a loaded machine pauses for longer is read half written.)
func replaceFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path+".new", []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

func TestServeHotReload(t *testing.T) {
	old := reloadPoll
	reloadPoll = 10 * time.Millisecond
	t.Cleanup(func() { reloadPoll = old })
	dir := t.TempDir()
	cfg := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(cfg, []byte(reloadV1), 0o644); err != nil {
		t.Fatal(err)
	}
	l, logs := startServe(t, "--config", cfg)

	for i := 0; i < 3; i++ {
		if m := take(t, l.API, `{"rule":"hourly","key":"k"}`); m["allowed"] != true {
			t.Fatalf("take %d: %v", i, m)
		}
	}
	if m := take(t, l.API, `{"rule":"hourly","key":"k"}`); m["allowed"] != false {
		t.Fatalf("4th take: %v", m)
	}

	// A valid change: "other" grows, "hourly" is untouched and keeps its
	// state; "added" is new.
	v2 := strings.Replace(reloadV1, "rate: 5, period: 1h", "rate: 50, period: 1h", 1) + `
  - name: added
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 2}
`
	replaceFile(t, cfg, v2)
	waitReloads(t, l.API, 1, 0)
	if m := take(t, l.API, `{"rule":"hourly","key":"k"}`); m["allowed"] != false {
		t.Errorf("hourly lost its state on reload: %v", m)
	}
	if m := take(t, l.API, `{"rule":"other","key":"k"}`); m["limit"] != 50.0 {
		t.Errorf("other after reload: %v", m)
	}
	if m := take(t, l.API, `{"rule":"added","key":"k"}`); m["allowed"] != true {
		t.Errorf("added after reload: %v", m)
	}

	// An invalid file is refused and the old policy keeps serving.
	replaceFile(t, cfg, strings.Replace(v2, "burst: 2", "burst: 2, bogus: 1", 1))
	waitReloads(t, l.API, 1, 1)
	if !strings.Contains(logs.String(), "reload refused") || !strings.Contains(logs.String(), "bogus") {
		t.Errorf("the refusal is not logged with its reason:\n%s", logs.String())
	}
	if m := take(t, l.API, `{"rule":"added","key":"k"}`); m["allowed"] != true || m["limit"] != 2.0 {
		t.Errorf("after a refused reload: %v", m)
	}

	// The policy in force again: news, since it ends the refusals.
	replaceFile(t, cfg, v2)
	waitReloads(t, l.API, 2, 1)

	// SIGHUP on a file that has not changed since is no reload: it is
	// neither counted nor logged as one.
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); !strings.Contains(logs.String(), "policy unchanged"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP on an unchanged file was not answered:\n%s", logs.String())
		}
	}
	if ok, failed := reloads(t, l.API); ok != 2 || failed != 1 {
		t.Errorf("SIGHUP on an unchanged file counted: %d ok, %d failed; want 2, 1", ok, failed)
	}
	if n := strings.Count(logs.String(), "policy reloaded"); n != 2 {
		t.Errorf("%d \"policy reloaded\" lines, want 2 (SIGHUP on an unchanged file is no reload):\n%s", n, logs.String())
	}
}

// Tightening a rule during an incident must not reset the clients it is
// meant to slow: a key drained under per-user 30/h, reloaded as 20/h
// (another rate, so state in other units), stays drained, and so it does
// when the rule is changed back.
func TestAttackReloadTighterRateKeepsDrainedKey(t *testing.T) {
	old := reloadPoll
	reloadPoll = 10 * time.Millisecond
	t.Cleanup(func() { reloadPoll = old })
	const v1 = `
rules:
  - name: per-user
    algorithm: token_bucket
    algorithm_config: {rate: 30, period: 1h}
`
	cfg := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(cfg, []byte(v1), 0o644); err != nil {
		t.Fatal(err)
	}
	l, _ := startServe(t, "--config", cfg)
	if m := take(t, l.API, `{"rule":"per-user","key":"u","cost":30}`); m["allowed"] != true {
		t.Fatalf("drain: %v", m)
	}
	// A token comes every 3 minutes at 20/h: longer than any wait below.
	replaceFile(t, cfg, strings.Replace(v1, "rate: 30", "rate: 20", 1))
	waitReloads(t, l.API, 1, 0)
	if m := take(t, l.API, `{"rule":"per-user","key":"u"}`); m["allowed"] != false || m["limit"] != 20.0 || m["remaining"] != 0.0 {
		t.Fatalf("the drained key after tightening the rule: %v, want rejected with 0 of 20", m)
	}
	replaceFile(t, cfg, v1)
	waitReloads(t, l.API, 2, 0)
	if m := take(t, l.API, `{"rule":"per-user","key":"u"}`); m["allowed"] != false || m["limit"] != 30.0 {
		t.Fatalf("the drained key after changing the rule back: %v, want rejected", m)
	}
}

func TestServeRefusesInvalidConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(cfg, []byte("rules:\n  - name: x\n    algorithm: token_bucket\n    algorithm_config: {rps: 10, burst: 1e12}\n"), 0o644)
	var logs lockedbuf.Buffer
	code := serve(context.Background(), []string{"--config", cfg, "--listen", "127.0.0.1:0"}, &logs, nil)
	if code != 1 || !strings.Contains(logs.String(), "bad.yaml:4") || !strings.Contains(logs.String(), "burst") {
		t.Errorf("exit %d, output:\n%s", code, logs.String())
	}
}

func TestServeProxy(t *testing.T) {
	var hits atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "app")
	}))
	t.Cleanup(app.Close)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "policy.yaml")
	auditLog := filepath.Join(dir, "audit.log")
	os.WriteFile(cfg, []byte(`
audit_log: `+auditLog+`
proxy:
  listen: 127.0.0.1:0
  upstream: `+app.URL+`
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm: token_bucket
    algorithm_config: {rate: 2, period: 1h}
`), 0o644)
	l, _ := startServe(t, "--config", cfg)
	var codes []int
	for i := 0; i < 3; i++ {
		resp, err := http.Get("http://" + l.Proxy + "/x")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 200 429]" || hits.Load() != 2 {
		t.Errorf("statuses %v, upstream hits %d", codes, hits.Load())
	}
	// The rejection is in the audit log, one JSON line.
	data, err := os.ReadFile(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatalf("audit log %q: %v", data, err)
	}
	// The real clock refills a few micro-tokens between the requests.
	if tok, _ := rec["tokens"].(float64); rec["rule"] != "per-ip" || rec["path"] != "/x" || rec["client_ip"] != "127.0.0.1" || tok >= 1 {
		t.Errorf("audit record %v", rec)
	}
}

func TestServeCPUProfile(t *testing.T) {
	prof := filepath.Join(t.TempDir(), "cpu.prof")
	t.Run("serve", func(t *testing.T) {
		l, _ := startServe(t, "--cpuprofile", prof)
		resp, err := http.Get("http://" + l.API + "/v1/auth")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}) // serve has shut down: the profile is written
	b, err := os.ReadFile(prof)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("profile is not a gzip-compressed pprof file: % x", b[:min(len(b), 8)])
	}

	var errb bytes.Buffer
	if code := serve(context.Background(), []string{"--cpuprofile", filepath.Join(t.TempDir(), "no", "such", "dir")}, &errb, nil); code != 1 || !strings.Contains(errb.String(), "cpu profile") {
		t.Fatalf("unwritable profile: exit %d, %q", code, errb.String())
	}
}

// proxy.upstream_timeout bounds the wait for the upstream's response
// headers: an upstream that never answers is a 504 problem once it
// passes, not after the default minute.
func TestServeProxyUpstreamTimeout(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers; freed when the proxy gives up
	}))
	t.Cleanup(app.Close)
	cfg := writePolicy(t, `
proxy:
  listen: 127.0.0.1:0
  upstream: `+app.URL+`
  upstream_timeout: 50ms
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rate: 100, period: 1h}
`)
	l, logs := startServe(t, "--config", cfg)
	client := &http.Client{Timeout: 30 * time.Second} // far beyond 50ms, far below the default 60s
	resp, err := client.Get("http://" + l.Proxy + "/slow")
	if err != nil {
		t.Fatalf("the proxy did not give up on the upstream: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 504 || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(body), "upstream timed out") {
		t.Errorf("%d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if !strings.Contains(logs.String(), "proxy: upstream timed out") {
		t.Errorf("the timeout is not in the log:\n%s", logs.String())
	}
}

// serve logs the store as written, its password hidden: memory:// is
// not memory:.
func TestServeLogsStoreAsWritten(t *testing.T) {
	_, logs := startServe(t)
	if !strings.Contains(logs.String(), "store=memory:// ") {
		t.Errorf("startup log:\n%s", logs.String())
	}
	for raw, want := range map[string]string{
		"memory://":                  "memory://",
		"memory://?max_keys=10":      "memory://?max_keys=10",
		"redis://:s3cret@cache:6379": "redis://:xxxxx@cache:6379",
		"redis://cache:6379/0":       "redis://cache:6379/0",
		"postgres://sluice@db/sluice?password=s3cret&sslmode=disable": "postgres://sluice@db/sluice?password=xxxxx&sslmode=disable",
	} {
		if got := redact(raw); got != want {
			t.Errorf("redact(%q) = %q, want %q", raw, got, want)
		}
	}
}
