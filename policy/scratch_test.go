package policy_test

import (
	"context"
	"net"
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
		want := policy.Enforce(ctx, alone, ms, policy.Options{})

		sin, err := s.FromForwardAuth(p, r, "/v1/auth")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(sin, in) {
			t.Fatalf("%d: input %+v, want %+v", i, sin, in)
		}
		sms, _ := s.Match(p, sin)
		got := policy.Enforce(ctx, reused, sms, policy.Options{Scratch: &s})
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
	got := policy.Enforce(ctx, reused, ms, policy.Options{Hold: true, Scratch: &s})
	want := policy.Enforce(ctx, alone, []policy.Match{ms[0]}, policy.Options{Hold: true})
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

// A connection's peer parsed once (WithPeer, as sluice serve's servers
// set it) is the request's peer only while RemoteAddr is still that
// connection's: a handler in front that rewrote RemoteAddr is believed,
// as it is without the cache, and never the address the cache holds.
func TestPeerParsedOncePerConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := mustParse(t, "rules:\n  - name: per-ip\n    limit_keys: [\"ip:address\"]\n    algorithm_config: {rps: 1, burst: 1}\n")
	r := httptest.NewRequest("GET", "/", nil).WithContext(policy.WithPeer(context.Background(), c))
	r.RemoteAddr = c.RemoteAddr().String()
	if in := p.FromHTTP(r); in.Peer.String() != r.RemoteAddr {
		t.Errorf("peer %v, want the connection's %s", in.Peer, r.RemoteAddr)
	}
	if ms, _ := p.Match(p.FromHTTP(r)); len(ms) != 1 || ms[0].Identity != "ip:127.0.0.1" {
		t.Errorf("the connection's client: matches %+v, want identity ip:127.0.0.1", ms)
	}
	r.RemoteAddr = "203.0.113.9:4000"
	in := p.FromHTTP(r)
	if in.Peer.String() != "203.0.113.9:4000" || in.ClientIP.String() != "203.0.113.9" {
		t.Errorf("RemoteAddr rewritten to 203.0.113.9:4000: peer %v, client %v", in.Peer, in.ClientIP)
	}
	if ms, _ := p.Match(in); len(ms) != 1 || ms[0].Identity != "ip:203.0.113.9" {
		t.Errorf("RemoteAddr rewritten: matches %+v, want identity ip:203.0.113.9", ms)
	}
	// The connection's peer a trusted proxy: the client, and its identity,
	// are the forwarded address, never the peer's.
	trusting := mustParse(t, "trusted_proxies: [\"127.0.0.0/8\"]\nrules:\n  - name: per-ip\n    limit_keys: [\"ip:address\"]\n    algorithm_config: {rps: 1, burst: 1}\n")
	r.RemoteAddr = c.RemoteAddr().String()
	r.Header.Set("X-Forwarded-For", "198.51.100.7")
	if ms, _ := trusting.Match(trusting.FromHTTP(r)); len(ms) != 1 || ms[0].Identity != "ip:198.51.100.7" {
		t.Errorf("behind a trusted peer: matches %+v, want identity ip:198.51.100.7", ms)
	}
}

// The RateLimit fields of a compiled limit, formatted once and kept, are
// what a Match built by hand (formatted every time) gets, also when the
// quota moves from one decision to the next.
func TestFieldsKeptAsFormatted(t *testing.T) {
	p := mustParse(t, "rules:\n  - name: per-user\n    limit_keys: [\"header:X-User\"]\n    algorithm_config: {rps: 2, burst: 10}\n")
	m, ok := p.LimitMatch("per-user", "u1")
	if !ok {
		t.Fatal("no match")
	}
	byHand := policy.Match{Rule: m.Rule, Request: m.Request}
	for _, q := range []int64{10, 10, 7, 10, 1 << 40} {
		d := sluice.Decision{Allowed: true, Capacity: q, Remaining: 3, ResetAfter: 4 * time.Second, Rule: "per-user", Tokens: 3}
		fields := func(m policy.Match) []policy.Field {
			v := policy.Verdict{Allowed: true, Overall: d, Results: []policy.Result{{Match: m, Decision: d}}}
			return policy.AppendFields(nil, &v, "", "/", nil)
		}
		kept, made := fields(m), fields(byHand)
		if !reflect.DeepEqual(kept, made) {
			t.Errorf("quota %d: kept %v, formatted %v", q, kept, made)
		}
	}
}
