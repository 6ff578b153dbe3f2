package policy_test

import (
	"context"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// A Scratch reused from request to request decides each as Match and
// Enforce (or Hold) do on their own, through two and three matches and
// back to one, and a cleared one decides alike.
func TestScratchDecidesAsMatchAndEnforce(t *testing.T) {
	cfg := `
trusted_proxies: ["192.0.2.0/24"]
forward_auth: {proxy: nginx}
rules:
  - name: per-user
    limit_keys: ["header:X-User"]
    algorithm_config: {rps: 1, burst: 3}
  - name: per-ip
    match: {path_prefix: ["/b"]}
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 2}
  - name: per-path
    match: {path_prefix: ["/b/c"]}
    limit_keys: ["path"]
    mode: shadow
    algorithm_config: {rps: 1, burst: 1}
`
	p := mustParse(t, cfg)
	// Two stores on one clock: the same decisions.
	alone, clk := newLimiter()
	reused := sluice.New(memory.New(memory.Options{Clock: clk}))
	var s policy.Scratch
	ctx := context.Background()
	for i, path := range []string{"/a", "/b", "/b/c", "/a", "/b/c", "/b/c", "/b", "/a", "/a"} {
		r := httptest.NewRequest("GET", "/v1/auth", nil)
		r.RemoteAddr = "192.0.2.1:5000"
		r.Header.Set("X-User", "u1")
		r.Header.Set("X-Original-URI", path)
		r.Header.Set("X-Original-Method", "GET")
		r.Header.Set("X-Original-Host", "example.com")
		r.Header.Set("X-Real-Ip", "203.0.113.9")
		in, err := p.FromForwardAuth(r, "/v1/auth")
		if err != nil {
			t.Fatal(err)
		}
		ms, _ := p.Match(in)
		want := policy.Enforce(ctx, alone, sluice.OpTake, ms, nil)

		sin, err := s.FromForwardAuth(p, r, "/v1/auth")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(sin, in) {
			t.Fatalf("%d: input %+v, want %+v", i, sin, in)
		}
		sms, _ := s.Match(p, sin)
		got := s.Enforce(ctx, reused, sluice.OpTake, sms, nil)
		if !reflect.DeepEqual(noRetryAt(got), noRetryAt(want)) {
			t.Fatalf("%d %s: verdict\n%+v\nwant\n%+v", i, path, got, want)
		}
		if i%3 == 2 {
			s.Clear()
		}
	}
	// Matches of the caller's making, held.
	ms := s.Matches(1)
	ms[0], _ = p.LimitMatch("per-user", "u2")
	got := s.Hold(ctx, reused, sluice.OpTake, ms, nil)
	want := policy.Hold(ctx, alone, sluice.OpTake, []policy.Match{ms[0]}, nil)
	if !reflect.DeepEqual(noRetryAt(got), noRetryAt(want)) {
		t.Fatalf("held: %+v, want %+v", got, want)
	}
	if in := s.FromHTTP(p, httptest.NewRequest("GET", "/x", nil)); !reflect.DeepEqual(in, p.FromHTTP(httptest.NewRequest("GET", "/x", nil))) {
		t.Fatalf("FromHTTP: %+v", in)
	}
}

// noRetryAt is v without its RetryAts, which read the wall clock.
func noRetryAt(v policy.Verdict) policy.Verdict {
	v.Overall.RetryAt = time.Time{}
	rs := append([]policy.Result(nil), v.Results...)
	for i := range rs {
		rs[i].Decision.RetryAt = time.Time{}
	}
	v.Results = rs
	return v
}
