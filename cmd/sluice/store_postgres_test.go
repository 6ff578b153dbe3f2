package main

import (
	"testing"
	"time"
)

// TestPostgresServeTimeout: under serve each PostgreSQL call has the
// 250 ms deadline the documentation gives, unless the URL's sluice_timeout
// says otherwise; the library's own default (one second) is for
// applications.
func TestPostgresServeTimeout(t *testing.T) {
	for _, c := range []struct {
		url  string
		want time.Duration
	}{
		{"postgres://app@db/app", 250 * time.Millisecond},
		{"postgres://app@db/app?sluice_timeout=2s", 2 * time.Second},
		{"postgresql://app@db/app?sluice_timeout=50ms&sluice_violations=true", 50 * time.Millisecond},
	} {
		_, o, err := postgresOptions(c.url)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if o.Timeout != c.want {
			t.Errorf("%s: Timeout = %v, want %v", c.url, o.Timeout, c.want)
		}
	}
}

// The URL's settings of the violation log reach the log serve starts;
// without them it has the library's defaults.
func TestPostgresServeViolationOptions(t *testing.T) {
	for _, c := range []struct {
		url                  string
		retention, perBucket time.Duration
	}{
		{"postgres://app@db/app?sluice_violations=true", 0, 0},
		{"postgres://app@db/app?sluice_violations=true&sluice_violations_retention=30d&sluice_violations_per_bucket=10s", 30 * 24 * time.Hour, 10 * time.Second},
		{"postgres://app@db/app?sluice_violations=true&sluice_violations_retention=0&sluice_violations_per_bucket=0", -1, -1},
	} {
		_, o, err := postgresOptions(c.url)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if v := o.RecordViolations; v == nil || v.Retention != c.retention || v.PerBucket != c.perBucket {
			t.Errorf("%s: RecordViolations = %+v, want retention %v, per bucket %v", c.url, v, c.retention, c.perBucket)
		}
	}
	if _, o, err := postgresOptions("postgres://app@db/app?sluice_violations_retention=30d"); err != nil || o.RecordViolations != nil {
		t.Errorf("retention without sluice_violations=true: %+v, %v; want no log", o.RecordViolations, err)
	}
}
