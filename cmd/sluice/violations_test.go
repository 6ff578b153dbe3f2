package main

import (
	"bytes"
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/postgres"
)

// A store opened from a URL with sluice_migrate and sluice_violations
// records its rejections (every one, with sluice_violations_per_bucket=0:
// a bucket's two below come within a second), and `sluice violations`
// lists them, newest first, filtered by user or IP.
func testViolationsCommand(t *testing.T, u string) {
	ctx := context.Background()
	store, closeStore, err := openStore(ctx, withParams(u, "sluice_migrate=true&sluice_violations=true&sluice_violations_per_bucket=0&sluice_housekeeping=0&sluice_timeout=1m"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	lim := sluice.MustLimit(sluice.Spec{Name: "per-user", TokensPerSecond: 1, Burst: 1})
	for i := 0; i < 3; i++ {
		if _, err := conformance.Take(ctx, store, engine.OpTake, sluice.Request{Limit: lim, Key: "user-42"}); err != nil {
			t.Fatal(err)
		}
	}
	ps := store.(*postgres.Store)
	ps.Violations().Record(postgres.Violation{BucketKey: "tb:per-ip:192.0.2.7", UserID: "alice", IP: netip.MustParseAddr("192.0.2.7"), Endpoint: "/api/search\x1b[31m", Rule: "per-ip", Tokens: 0.25})
	if err := ps.Violations().Flush(ctx); err != nil {
		t.Fatal(err)
	}

	var out, errb bytes.Buffer
	if code := run([]string{"violations", "--url", u, "--since", "1h"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "TIME") {
		t.Fatalf("want a header and 3 rows, got:\n%s", out.String())
	}
	if !strings.Contains(lines[1], "per-ip") || !strings.Contains(lines[1], "192.0.2.7") || !strings.Contains(lines[1], "alice") {
		t.Fatalf("newest first: first row %q", lines[1])
	}
	if strings.Contains(out.String(), "\x1b") {
		t.Fatal("a control character from a client reached the terminal")
	}
	if !strings.Contains(lines[2], "tb:per-user:user-42") {
		t.Fatalf("second row %q", lines[2])
	}

	out.Reset()
	if code := run([]string{"violations", "--url", u, "--ip", "192.0.2.7"}, &out, &errb); code != 0 || strings.Count(out.String(), "\n") != 2 {
		t.Fatalf("--ip: exit %d, output:\n%s", code, out.String())
	}
	out.Reset()
	if code := run([]string{"violations", "--url", u, "--user", "bob"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "no violations") {
		t.Fatalf("--user bob: exit %d, output:\n%s", code, out.String())
	}
	out.Reset()
	// Older than --since: nothing.
	if code := run([]string{"violations", "--url", u, "--since", "1ns"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "no violations in the last 1ns") {
		t.Fatalf("--since 1ns: exit %d, output:\n%s", code, out.String())
	}
	// Days, weeks and times: all three are newer than any of them.
	future := time.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		since string
		rows  int
	}{{"1d", 3}, {"2w", 3}, {"1w2d12h", 3}, {"1.5d", 3}, {time.Now().Add(-time.Hour).Format(time.RFC3339Nano), 3}, {time.Now().AddDate(0, 0, -1).Format(time.DateOnly), 3}} {
		out.Reset()
		if code := run([]string{"violations", "--url", u, "--since", tc.since}, &out, &errb); code != 0 || strings.Count(out.String(), "\n") != tc.rows+1 {
			t.Fatalf("--since %s: exit %d, stderr %s, output:\n%s", tc.since, code, errb.String(), out.String())
		}
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"violations", "--url", u, "--since", future}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--since must be in the past") {
		t.Fatalf("--since %s: exit %d, stderr %s", future, code, errb.String())
	}

	// A user keyed by a header is no verified subject: --user does not
	// find it, --key does.
	p, err := policy.Parse("p.yaml", []byte("rules:\n  - name: per-header-user\n    limit_keys: [\"header:x-user\", path]\n    algorithm_config: {rps: 1, burst: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := p.Match(&policy.Input{Method: "GET", Path: "/api/x", Header: http.Header{"X-User": {"alice"}}})
	for i := 0; i < 2; i++ {
		if _, err := conformance.Take(ctx, store, engine.OpTake, ms[0].Request); err != nil {
			t.Fatal(err)
		}
	}
	if err := ps.Violations().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{"violations", "--url", u, "--user", "alice", "--since", "1d"}, &out, &errb); code != 0 || strings.Count(out.String(), "\n") != 2 || !strings.Contains(out.String(), "per-ip") {
		t.Fatalf("--user alice: only the verified subject's, got exit %d:\n%s", code, out.String())
	}
	for _, key := range []string{"alice", "/api/x", "tb:per-header-user:alice|/api/x"} {
		out.Reset()
		if code := run([]string{"violations", "--url", u, "--key", key}, &out, &errb); code != 0 || strings.Count(out.String(), "\n") != 2 || !strings.Contains(out.String(), "tb:per-header-user:alice|/api/x") {
			t.Fatalf("--key %s: exit %d:\n%s", key, code, out.String())
		}
	}
	out.Reset()
	if code := run([]string{"violations", "--url", u, "--key", "ali"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "no violations") {
		t.Fatalf("--key ali: exit %d:\n%s", code, out.String())
	}
}

// On a database that was never migrated, violations says what to run
// instead of quoting the server.
func testViolationsUnmigrated(t *testing.T, u string) {
	var out, errb bytes.Buffer
	if code := run([]string{"violations", "--url", u}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "the database has no sluice tables: run `sluice migrate --url ...`") || strings.Contains(errb.String(), "relation") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	t.Setenv("SLUICE_POSTGRES_URL", u)
	if code := run([]string{"violations"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "run `sluice migrate`") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

func TestViolationsBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"violations", "--since", "-1h", "--url", "postgres://h/db"}, "must be positive"},
		{[]string{"violations", "--since", "soon", "--url", "postgres://h/db"}, `invalid value "soon" for flag -since: "soon" is not a duration or an RFC 3339 time: write 90m, 36h, 1d, 2w`},
		{[]string{"violations", "--since", "1dd", "--url", "postgres://h/db"}, "is not a duration"},
		{[]string{"violations", "--since", "9999999999w", "--url", "postgres://h/db"}, "is not a duration"},
		{[]string{"violations", "--ip", "not-an-ip", "--url", "postgres://h/db"}, "--ip"},
		{[]string{"violations", "--limit", "0", "--url", "postgres://h/db"}, "--limit"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
