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
