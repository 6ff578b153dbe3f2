package postgres_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/postgres"
)

func TestSplitURL(t *testing.T) {
	conn, o, err := postgres.SplitURL("postgres://app@db:5432/app?sslmode=disable&sluice_migrate=true&sluice_key_prefix=a1:&sluice_housekeeping=0&sluice_violations=true&sluice_rules=1&sluice_timeout=150ms&pool_max_conns=8")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(conn, "sluice_") || !strings.Contains(conn, "sslmode=disable") || !strings.Contains(conn, "pool_max_conns=8") {
		t.Fatalf("pgx's URL %q: sluice's parameters must go, the others stay", conn)
	}
	if !o.Migrate || o.KeyPrefix != "a1:" || o.HousekeepingInterval != -1 || !o.LogViolations || !o.Rules || o.Timeout != 150*time.Millisecond {
		t.Fatalf("options %+v", o)
	}
	if _, o, err := postgres.SplitURL("postgres://db/app"); err != nil || o.Timeout != 0 || o.Migrate || o.ViolationOptions != (postgres.ViolationOptions{}) {
		t.Fatalf("no parameters: %+v, %v", o, err)
	}
	// The violation log's retention counts days and weeks; 0 turns a
	// setting off (negative in the options, whose zero is the default).
	for _, c := range []struct {
		query                string
		retention, perBucket time.Duration
	}{
		{"sluice_violations_retention=7d&sluice_violations_per_bucket=10s", 7 * 24 * time.Hour, 10 * time.Second},
		{"sluice_violations_retention=1w12h&sluice_violations_per_bucket=250ms", 7*24*time.Hour + 12*time.Hour, 250 * time.Millisecond},
		{"sluice_violations_retention=36h", 36 * time.Hour, 0},
		{"sluice_violations_retention=0&sluice_violations_per_bucket=0", -1, -1},
	} {
		conn, o, err := postgres.SplitURL("postgres://db/app?sluice_violations=true&" + c.query)
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		if strings.Contains(conn, "sluice_") {
			t.Errorf("%s: pgx's URL %q keeps a sluice parameter", c.query, conn)
		}
		if o.ViolationOptions.Retention != c.retention || o.ViolationOptions.PerBucket != c.perBucket {
			t.Errorf("%s: %+v, want retention %v and per bucket %v", c.query, o.ViolationOptions, c.retention, c.perBucket)
		}
	}
	for _, bad := range []struct{ url, want string }{
		{"mysql://db/app", "scheme"},
		{"postgres://db/app?sluice_migrate=maybe", "sluice_migrate"},
		{"postgres://db/app?sluice_housekeeping=-1s", "sluice_housekeeping"},
		{"postgres://db/app?sluice_timeout=0", "sluice_timeout"},
		{"postgres://db/app?sluice_timeout=soon", "sluice_timeout"},
		{"postgres://db/app?sluice_violations_retention=-1d", "sluice_violations_retention"},
		{"postgres://db/app?sluice_violations_retention=forever", "sluice_violations_retention"},
		{"postgres://db/app?sluice_violations_retention=99999999w", "sluice_violations_retention"},
		{"postgres://db/app?sluice_violations_per_bucket=-1s", "sluice_violations_per_bucket"},
		{"postgres://db/app?sluice_violations_per_bucket=1d", "sluice_violations_per_bucket"},
	} {
		if _, _, err := postgres.SplitURL(bad.url); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want an error naming %s", bad.url, err, bad.want)
		}
	}
}

// CheckURL refuses what Open would, without a server to connect to, and
// keeps the password out of its errors.
func TestCheckURL(t *testing.T) {
	if err := postgres.CheckURL("postgres://app:hunter2@db/app?sslmode=disable&sluice_rules=true&pool_max_conns=8"); err != nil {
		t.Fatal(err)
	}
	for bad, want := range map[string]string{
		"postgres://app:hunter2@db/app?sluice_migrate=maybe": "sluice_migrate",
		"postgres://app:hunter2@db/app?pool_max_conns=lots":  "pool_max_conns",
		"postgres://app:hunter2@db/app?sslmode=sometimes":    "sslmode",
	} {
		err := postgres.CheckURL(bad)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v, want an error naming %s without the password", bad, err, want)
		}
	}
}

// A URL that net/url cannot parse (a port or an escape mistyped) is
// reported without its password: url.Parse's error repeats the whole URL.
func TestAttackStoreURLParseErrorEchoesPassword(t *testing.T) {
	for _, bad := range []string{"postgres://u:hunter2@db:port/app", "postgres://u:hunter2@db/app%zz"} {
		_, _, err := postgres.SplitURL(bad)
		if err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v, want an error without the password", bad, err)
		}
	}
}
