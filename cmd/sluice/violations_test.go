package main

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/postgres"
)

// A store opened from a URL with sluice_migrate and sluice_violations
// records its rejections, and `sluice violations` lists them, newest
// first, filtered by user or IP.
func testViolationsCommand(t *testing.T, u string) {
	ctx := context.Background()
	store, closeStore, err := openStore(ctx, withParams(u, "sluice_migrate=true&sluice_violations=true&sluice_housekeeping=0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	lim := sluice.MustLimit(sluice.Spec{Name: "per-user", TokensPerSecond: 1, Burst: 1})
	for i := 0; i < 3; i++ {
		if _, err := store.Take(ctx, sluice.OpTake, sluice.Request{Limit: lim, Key: "user-42"}); err != nil {
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
	if code := run([]string{"violations", "--url", u, "--since", "1ns"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "no violations") {
		t.Fatalf("--since 1ns: exit %d, output:\n%s", code, out.String())
	}
}

func TestViolationsBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"violations", "--since", "-1h", "--url", "postgres://h/db"}, "--since must be positive"},
		{[]string{"violations", "--since", "soon", "--url", "postgres://h/db"}, "invalid value"},
		{[]string{"violations", "--ip", "not-an-ip", "--url", "postgres://h/db"}, "--ip"},
		{[]string{"violations", "--limit", "0", "--url", "postgres://h/db"}, "--limit"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
