package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckValidFile(t *testing.T) {
	t.Setenv("SLUICE_JWT_SECRET", "0123456789abcdef0123456789abcdef")
	t.Setenv("SLUICE_API_TOKEN", "0123456789abcdef0123456789abcdef")
	var out, errb bytes.Buffer
	code := run([]string{"check", "../../examples/global-rps.yaml", "../../examples/tiered.yaml", "../../examples/policy.yaml", "../../examples/ratelimit-config.yaml"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	want := "../../examples/global-rps.yaml: ok (1 rule)\n"
	if !strings.HasPrefix(out.String(), want) {
		t.Fatalf("stdout %q, want it to start with %q", out.String(), want)
	}
	// A reference-format file has no rules of sluice's own: its limits are
	// counted instead.
	if want := "../../examples/ratelimit-config.yaml: ok (envoyproxy/ratelimit format: 6 rate limits, domain edge)\n"; !strings.Contains(out.String(), want) {
		t.Fatalf("stdout %q, want a line %q", out.String(), want)
	}
}

func TestCheckInvalidFile(t *testing.T) {
	t.Setenv("SLUICE_JWT_SECRET", "")
	file := filepath.Join(t.TempDir(), "bad.yaml")
	cfg := `listen: ":8080"
rules:
  - name: ok
    algorithm_config: {rps: 10, burst: 20}
  - name: typo
    limit_key: ["ip:address"]
    algorithm_config: {rps: 10, burst: 20}
  - name: huge-burst
    algorithm_config:
      tokens_per_second: 100
      burst: 1e12
`
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"check", file}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1; stdout %q stderr %q", code, out.String(), errb.String())
	}
	want := file + ":6: rules[1].limit_key: unknown field (did you mean \"limit_keys\"?)\n" +
		file + ":11: rules[2].algorithm_config.burst: must be at most 9007199254.740992 (2^53 micro-tokens, the most every store counts exactly), got 1e+12\n"
	if errb.String() != want {
		t.Fatalf("stderr:\n%s\nwant:\n%s", errb.String(), want)
	}
	if out.Len() != 0 {
		t.Fatalf("stdout %q, want nothing", out.String())
	}
}

func TestCheckUnknownStore(t *testing.T) {
	file := filepath.Join(t.TempDir(), "store.yaml")
	cfg := "store: {url: \"memroy://\"}\nrules:\n  - name: a\n    algorithm_config: {rps: 1, burst: 1}\n"
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"check", file}, &out, &errb); code != 1 || !strings.Contains(errb.String(), `store.url: unknown store "memroy"`) {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

func TestCheckUsage(t *testing.T) {
	for _, args := range [][]string{{"check"}, {"check", "--bogus", "x.yaml"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		if !strings.Contains(errb.String(), "usage: sluice check") {
			t.Errorf("%v: stderr %q lacks the usage", args, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"check", filepath.Join(t.TempDir(), "missing.yaml")}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "missing.yaml: open") {
		t.Errorf("missing file: exit %d, stderr %q", code, errb.String())
	}
}

// A valid file that lets clients pick their own plan is a warning: check
// prints it and still exits 0, and serve logs it.
func TestCheckWarnings(t *testing.T) {
	file := filepath.Join(t.TempDir(), "warn.yaml")
	cfg := "rules_table:\n  plan: header:X-Plan\nrules:\n  - name: a\n    algorithm_config: {rps: 1, burst: 1}\n"
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"check", file}, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	want := "warning: " + file + ":2: rules_table.plan: header:X-Plan is whatever the client sends"
	if !strings.HasPrefix(errb.String(), want) || strings.Count(errb.String(), "\n") != 1 {
		t.Fatalf("stderr %q, want one line starting %q", errb.String(), want)
	}
	if out.String() != file+": ok (1 rule)\n" {
		t.Fatalf("stdout %q", out.String())
	}
	_, logs := startServe(t, "--config", file)
	if !strings.Contains(logs.String(), "rules_table.plan: header:X-Plan is whatever the client sends") {
		t.Fatalf("serve did not log the warning:\n%s", logs.String())
	}
}

// check validates forward_auth, and warns without failing when it cannot
// take effect.
func TestCheckForwardAuth(t *testing.T) {
	dir := t.TempDir()
	write := func(name, cfg string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(cfg+"rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	typo := write("typo.yaml", "trusted_proxies: [127.0.0.1]\nforward_auth: {proxy: traefk}\n")
	var out, errb bytes.Buffer
	if code := run([]string{"check", typo}, &out, &errb); code != 1 || errb.String() != typo+":2: forward_auth.proxy: unknown proxy \"traefk\" (did you mean \"traefik\"?)\n" {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
	lonely := write("lonely.yaml", "forward_auth: {proxy: nginx}\n")
	out.Reset()
	errb.Reset()
	if code := run([]string{"check", lonely}, &out, &errb); code != 0 ||
		!strings.HasPrefix(errb.String(), "warning: "+lonely+":1: forward_auth: trusted_proxies is empty") || out.String() != lonely+": ok (1 rule)\n" {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

// A rule that reserves without max_reserved is valid and owes at most
// its capacity (the default max_reserved of a served rule); check tells
// every reserving rule's bound.
func TestCheckReservationBound(t *testing.T) {
	file := filepath.Join(t.TempDir(), "open.yaml")
	cfg := `rules:
  - name: bounded
    algorithm_config: {rps: 10, burst: 20, reserve: true, max_reserved: 40}
  - name: open
    algorithm: fixed_window
    algorithm_config: {rate: 10, period: 1m, reserve: true}
`
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"check", file}, &out, &errb); code != 0 {
		t.Fatalf("exit %d; stderr %q", code, errb.String())
	}
	if errb.Len() != 0 {
		t.Fatalf("stderr %q", errb.String())
	}
	want := file + ": ok (2 rules)\n" +
		"note: " + file + ":3: rules[0].algorithm_config.reserve: a reservation owes at most 40 tokens (max_reserved): a turn is at most 4s ahead, and a client that leaves before its turn cannot lock its bucket's other clients out for longer\n" +
		"note: " + file + ":6: rules[1].algorithm_config.reserve: a reservation owes at most 10 tokens (the default max_reserved: the capacity): a turn is at most 1m0s ahead, and a client that leaves before its turn cannot lock its bucket's other clients out for longer\n"
	if out.String() != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s", out.String(), want)
	}
}

// check tells what burst_seconds came to, and an adaptive rate's bounds
// and steps, after the file's ok line.
func TestCheckNotes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"check", "../../examples/llm-gateway.yaml"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	for _, want := range []string{
		"../../examples/llm-gateway.yaml: ok (3 rules)\n",
		": rules[0].algorithm_config.burst_seconds: 300 seconds of 60000 tokens per 1m give a burst of 300000 tokens\n",
		": rules[2].algorithm_config.adaptive: starts at 20 tokens/s and moves between 2 and 50",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout:\n%s\nwant a line %q", out.String(), want)
		}
	}
	if !strings.Contains(out.String(), "\nnote: ../../examples/llm-gateway.yaml:") {
		t.Errorf("stdout:\n%s\nwant note: lines", out.String())
	}
	if errb.Len() != 0 {
		t.Errorf("stderr %q", errb.String())
	}
}

// sluice check accepts the windows people bill by: a sliding window and a
// calendar month in a time zone; an unknown zone names its line.
func TestCheckCalendarAndSlidingWindows(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "billing.yaml")
	if err := os.WriteFile(good, []byte(`rules:
  - name: calls-per-month
    limit_keys: ["header:X-Api-Key"]
    algorithm: fixed_window
    algorithm_config: {rate: 1000, period: month, timezone: Europe/Berlin}
  - name: smooth-minute
    limit_keys: ["header:X-Api-Key"]
    algorithm: sliding_window
    algorithm_config: {rate: 100, period: 1m}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"check", good}, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	if want := good + ": ok (2 rules)"; !strings.Contains(out.String(), want) {
		t.Fatalf("stdout %q, want %q", out.String(), want)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(`rules:
  - name: calls-per-month
    algorithm: fixed_window
    algorithm_config: {rate: 1000, period: month, timezone: Mars/Olympus}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"check", bad}, &out, &errb); code == 0 {
		t.Fatalf("an unknown time zone passed: %s", out.String())
	}
	if msg := errb.String(); !strings.Contains(msg, "bad.yaml:4") || !strings.Contains(msg, "timezone") {
		t.Fatalf("the error does not name the line and field: %q", msg)
	}
}
