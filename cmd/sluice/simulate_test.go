package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// simulateRows runs sluice simulate and returns its table rows as fields.
func simulateRows(t *testing.T, args ...string) ([][]string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(append([]string{"simulate"}, args...), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rows [][]string
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && strings.HasSuffix(f[0], "s") && f[1] != "offered" {
			rows = append(rows, f)
		}
	}
	return rows, out.String()
}

func TestSimulateTokenBucket(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(cfg, []byte("rules:\n  - name: api\n    algorithm: token_bucket\n    algorithm_config: {rps: 10, burst: 10}\n  - name: other\n    algorithm_config: {rps: 1, burst: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// 20 requests a second, one every 50ms, against 10 tokens refilled at
	// 10/s: the burst and the refill admit the first 19 (the 19th, at
	// 0.9s, takes the last whole token), then every other one.
	rows, out := simulateRows(t, "--config", cfg, "--limit", "api", "--pattern", "20/s for 2s, 1/s for 2s")
	want := [][]string{
		{"0s", "20", "19", "1", "0"},
		{"1s", "20", "10", "10", "0"},
		{"2s", "1", "1", "0", "0"}, // the half token left at 1.95s, and 0.5 more
		{"3s", "1", "1", "0", "9"}, // full again, less 1
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d:\n%s", len(rows), len(want), out)
	}
	for i, w := range want {
		if got := strings.Join(rows[i][:5], " "); got != strings.Join(w, " ") {
			t.Fatalf("row %d: %q, want %q\n%s", i, got, strings.Join(w, " "), out)
		}
	}
	if !strings.Contains(out, "limit api: token bucket of 10, refilling 10/s") || !strings.Contains(out, "total: 42 offered, 31 admitted (73.8%), 11 rejected") {
		t.Fatalf("summary:\n%s", out)
	}
	// The clock is simulated: the same answer every run.
	if _, again := simulateRows(t, "--config", cfg, "--limit", "api", "--pattern", "20/s for 2s, 1/s for 2s"); again != out {
		t.Fatalf("a second run differs:\n%s\n%s", out, again)
	}
}

func TestSimulateReferenceFile(t *testing.T) {
	rows, out := simulateRows(t, "--config", "../../examples/ratelimit-config.yaml", "--limit", "envoy.edge.0", "--pattern", "20/s for 60s", "--step", "30s")
	// 600 a minute, asked 1,200 times in a minute: one window admits 600,
	// two (when a window starts inside the minute) up to twice that.
	admitted := 0
	for _, r := range rows {
		if r[1] != "600" {
			t.Fatalf("row %v: want 600 offered\n%s", r, out)
		}
		n, err := strconv.Atoi(r[2])
		if err != nil {
			t.Fatal(err)
		}
		admitted += n
	}
	if len(rows) != 2 || admitted < 600 || admitted > 1200 {
		t.Fatalf("%d rows, admitted %d of 1,200 against 600 a minute\n%s", len(rows), admitted, out)
	}
	if !strings.Contains(out, "limit envoy.edge.0: fixed window of 600 per 1m0s") {
		t.Fatalf("summary:\n%s", out)
	}
}

func TestSimulateBadInput(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(cfg, []byte("rules:\n  - name: a\n    algorithm_config: {rps: 1, burst: 1}\n  - name: b\n    algorithm_config: {rps: 1, burst: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--pattern", "20/s for 1s, 10 per s"}, 2, `segment 2 "10 per s"`},
		{[]string{"--pattern", "20/d for 1s"}, 2, `"N/s", "N/m" or "N/h"`},
		{[]string{"--pattern", "-1/s for 1s"}, 2, "finite number >= 0"},
		{[]string{"--pattern", "NaN/s for 1s"}, 2, "finite number >= 0"},
		{[]string{"--pattern", "1/s for -1s"}, 2, "duration must be positive"},
		{[]string{"--pattern", ""}, 2, "empty"},
		{[]string{"--pattern", "1e9/s for 1h"}, 2, "at most 10000000"},
		{[]string{"--pattern", "1/s for 24h", "--step", "1s"}, 2, "use a longer --step"},
		{[]string{"--pattern", "1/s for 1s", "--cost", "NaN"}, 2, "--cost must be"},
		{[]string{"--config", cfg, "--pattern", "1/s for 1s"}, 2, "name one with --limit (a, b)"},
		{[]string{"--config", cfg, "--limit", "c", "--pattern", "1/s for 1s"}, 2, `no limit "c" in the policy (it has: a, b)`},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"simulate"}, tc.args...), &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}
