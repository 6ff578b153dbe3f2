package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/postgres/pgtest"
)

// TestPostgres runs the PostgreSQL commands' tests against one throwaway
// server (starting one takes seconds), each on a database of its own.
func TestPostgres(t *testing.T) {
	srv := pgtest.ForTest(t)
	newDB := func(t *testing.T) string {
		t.Helper()
		u, err := srv.NewDatabase(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	t.Run("migrate", func(t *testing.T) { testMigrate(t, newDB(t)) })
	t.Run("violations", func(t *testing.T) { testViolationsCommand(t, newDB(t)) })
	t.Run("violations-unmigrated", func(t *testing.T) { testViolationsUnmigrated(t, newDB(t)) })
	t.Run("rules-hook", func(t *testing.T) { testPostgresRulesHook(t, newDB(t)) })
	t.Run("serve-rules-table", func(t *testing.T) { testServeRulesTable(t, newDB(t)) })
	t.Run("serve-concurrency", func(t *testing.T) {
		testFleetConcurrency(t, withParams(newDB(t), "sluice_migrate=true&sluice_timeout=1m"))
	})
}

// withParams appends query parameters to a URL.
func withParams(u, params string) string {
	if strings.Contains(u, "?") {
		return u + "&" + params
	}
	return u + "?" + params
}

func testMigrate(t *testing.T, u string) {
	var out, errb bytes.Buffer
	if code := run([]string{"migrate", "--url", u}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "applied 0001_buckets") || !strings.Contains(out.String(), "schema is at version") {
		t.Fatalf("first migrate printed %q", out.String())
	}
	// Idempotent: the second run applies nothing. The URL may carry sluice's
	// own parameters, which are not sent to the server.
	out.Reset()
	t.Setenv("SLUICE_POSTGRES_URL", withParams(u, "sluice_migrate=true"))
	if code := run([]string{"migrate"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "schema is up to date at version") {
		t.Fatalf("second migrate printed %q", out.String())
	}
}

func TestMigrateBadInput(t *testing.T) {
	t.Setenv("SLUICE_POSTGRES_URL", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate"}, "no database"},
		{[]string{"migrate", "--url", "mysql://x"}, "want postgres"},
		{[]string{"migrate", "--url", "postgres://h/db?sluice_migrate=maybe"}, "not true or false"},
		{[]string{"migrate", "extra"}, "unexpected argument"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

// serve's policy source for sluice_rules compiles the file with the
// table's rows; a file that is refused changes nothing.
func testPostgresRulesHook(t *testing.T, u string) {
	ctx := context.Background()
	var out, errb bytes.Buffer
	if code := run([]string{"migrate", "--url", u}, &out, &errb); code != 0 {
		t.Fatalf("migrate: %s", errb.String())
	}
	path := filepath.Join(t.TempDir(), "f.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  - name: from-file\n    algorithm_config: {tokens_per_second: 1, burst: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := newConfigFile(path).File
	if src, p, err := rulesSource(ctx, u, nil, file); src != nil || p != nil || err != nil {
		t.Fatalf("without sluice_rules=true: %v %v", src, err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO sluice_rules (key_pattern, scope, rate_per_second, burst_capacity) VALUES ('ip:{ip}', 'ip', 5, 10)`); err != nil {
		t.Fatal(err)
	}
	src, p, err := rulesSource(ctx, withParams(u, "sluice_rules=true"), nil, file)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if p.Rule("from-file") == nil || p.Rule("db-1") == nil {
		t.Fatalf("rules %v", p.Rules)
	}
	if err := os.WriteFile(path, []byte("rules:\n  - name: no-config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Load(ctx, true); err == nil || !strings.Contains(err.Error(), "f.yaml:2") {
		t.Fatalf("an invalid file: %v, want its error with its line", err)
	}
	if src.Policy() != p {
		t.Fatal("the refused file replaced the policy")
	}
}

// testServeRulesTable runs sluice serve on the postgres store with rules in
// sluice_rules: a row's rule is enforced beside the file's, and a row added
// while serving takes effect through NOTIFY.
func testServeRulesTable(t *testing.T, u string) {
	ctx := context.Background()
	var out, errb bytes.Buffer
	if code := run([]string{"migrate", "--url", u}, &out, &errb); code != 0 {
		t.Fatalf("migrate: %s", errb.String())
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO sluice_rules (key_pattern, scope, rate_per_second, burst_capacity) VALUES ('user:{user}', 'user', 0.01, 3)`); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	// sluice_timeout: a store deadline no loaded machine reaches (serve's
	// own cap on a decision, 2s, still applies); the test checks answers.
	file := "store:\n  url: " + strconv.Quote(withParams(u, "sluice_rules=true&sluice_violations=true&sluice_timeout=1m")) + "\nrules_table: {user: \"ip:address\"}\nrules:\n  - name: from-file\n    algorithm_config: {tokens_per_second: 1, burst: 1}\n"
	if err := os.WriteFile(cfg, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	l, logs := startServe(t, "--config", cfg)
	for i := 0; i < 3; i++ {
		if d := take(t, l.API, `{"rule":"db-1.all-plans","key":"u1"}`); d["allowed"] != true {
			t.Fatalf("take %d of the table's rule: %v\n%s", i+1, d, logs.String())
		}
	}
	if d := take(t, l.API, `{"rule":"db-1.all-plans","key":"u1"}`); d["allowed"] != false {
		t.Fatalf("the table's burst of 3 admitted a fourth: %v", d)
	}
	if d := take(t, l.API, `{"rule":"from-file","key":"u1"}`); d["allowed"] != true {
		t.Fatalf("the file's rule: %v", d)
	}
	// The rejection is in sluice_violations with the client, the endpoint
	// and its sluice_rules row (written off the request path, so poll),
	// and the violation log's counters are on /metrics.
	for deadline := time.Now().Add(20 * time.Second); ; {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM sluice_violations WHERE rule = 'db-1.all-plans' AND rule_id = 1 AND host(ip_address) = '127.0.0.1' AND endpoint = '/v1/take'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d violations recorded for the rejection, want 1", n)
		}
		time.Sleep(50 * time.Millisecond) // waiting for the batch writer, not for tokens
	}
	resp, err := http.Get("http://" + l.API + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "sluice_postgres_violations_written_total") {
		t.Fatalf("/metrics lacks the violation log's counters")
	}
	if _, err := conn.Exec(ctx, `INSERT INTO sluice_rules (key_pattern, scope, rate_per_second, burst_capacity) VALUES ('global', 'global', 0.01, 1)`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		d := take(t, l.API, `{"rule":"db-2.all-plans","key":"g"}`)
		if d["allowed"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rule added while serving never took effect: %v\n%s", d, logs.String())
		}
		time.Sleep(50 * time.Millisecond) // waiting for NOTIFY, not for tokens
	}
}
