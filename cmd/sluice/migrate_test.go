package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/postgres/pgtest"
)

// newPostgresDB starts a throwaway PostgreSQL for the test and returns the
// URL of an empty database on it.
func newPostgresDB(t *testing.T) string {
	t.Helper()
	srv := pgtest.ForTest(t)
	u, err := srv.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// withParams appends query parameters to a URL.
func withParams(u, params string) string {
	if strings.Contains(u, "?") {
		return u + "&" + params
	}
	return u + "?" + params
}

func TestMigrate(t *testing.T) {
	u := newPostgresDB(t)
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
