package envoyrls_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/lockedbuf"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

const (
	OK   = rlspb.RateLimitResponse_OK
	OVER = rlspb.RateLimitResponse_OVER_LIMIT
)

// t0 is midnight UTC, a boundary of every unit's windows.
var t0 = time.Unix(1767225600, 0)

// harness is a Server on a loopback listener and a client built from the
// same go-control-plane types Envoy uses.
type harness struct {
	rls   rlspb.RateLimitServiceClient
	conn  *grpc.ClientConn
	clock *sluice.ManualClock
	store *conformance.FaultyStore
	logs  *lockedbuf.Buffer
}

func start(t *testing.T, pol *policy.Policy) *harness {
	t.Helper()
	clock := sluice.NewManualClock(t0)
	h := startOn(t, pol, memory.New(memory.Options{Clock: clock}), clock)
	h.clock = clock
	return h
}

// startOn is start on another store, whose clock is clock (nil: the
// system clock).
func startOn(t *testing.T, pol *policy.Policy, st sluice.Store, clock sluice.Clock) *harness {
	t.Helper()
	// The options sluice serves with, so that the answers are checked
	// through its codec too.
	return startWith(t, pol, st, clock, envoyrls.ServerOptions()...)
}

// startWith is startOn on a server with opts.
func startWith(t *testing.T, pol *policy.Policy, st sluice.Store, clock sluice.Clock, opts ...grpc.ServerOption) *harness {
	t.Helper()
	store := &conformance.FaultyStore{Store: st}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	logs := new(lockedbuf.Buffer)
	// A store deadline far beyond any call's duration on a loaded machine:
	// these tests check answers, and a call past the default 250ms would be
	// answered by on_store_error instead.
	envoyrls.New(pol, sluice.NewWithOptions(store, sluice.Options{Clock: clock}), envoyrls.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)), StoreTimeout: time.Minute}).Register(g)
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &harness{rls: rlspb.NewRateLimitServiceClient(conn), conn: conn, store: store, logs: logs}
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func hits(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func (h *harness) call(t *testing.T, domain string, requestHits uint32, ds ...*rlv3.RateLimitDescriptor) *rlspb.RateLimitResponse {
	t.Helper()
	resp, err := h.rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: requestHits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

// expect checks the overall code and each descriptor's code and remaining.
func expect(t *testing.T, resp *rlspb.RateLimitResponse, overall rlspb.RateLimitResponse_Code, want ...any) {
	t.Helper()
	if resp.OverallCode != overall {
		t.Errorf("overall %v, want %v (%v)", resp.OverallCode, overall, resp)
	}
	for i := 0; i+1 < len(want); i += 2 {
		st := resp.Statuses[i/2]
		if st.Code != want[i].(rlspb.RateLimitResponse_Code) || st.LimitRemaining != uint32(want[i+1].(int)) {
			t.Errorf("status %d: %v remaining %d, want %v remaining %d", i/2, st.Code, st.LimitRemaining, want[i], want[i+1])
		}
	}
}

func header(resp *rlspb.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if strings.EqualFold(h.Key, name) {
			return h.Value
		}
	}
	return ""
}

const refYAML = `domain: test
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {name: ab, unit: minute, requests_per_unit: 600}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: ua
    value: bot*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: ua
    value: botany
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: shared
    value: bot*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: open
    rate_limit: {unlimited: true}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: p
    rate_limit: {name: base, unit: second, requests_per_unit: 1}
  - key: q
    rate_limit:
      name: override
      unit: hour
      unit_multiplier: 2
      requests_per_unit: 5
      replaces: [{name: base}]
`

func startRef(t *testing.T) *harness {
	t.Helper()
	pol, err := envoyrls.ParseReferenceConfig("test.yaml", []byte(refYAML))
	if err != nil {
		t.Fatal(err)
	}
	return start(t, pol)
}

func TestSingleDescriptor(t *testing.T) {
	h := startRef(t)
	for want := 2; want >= 0; want-- {
		expect(t, h.call(t, "test", 0, desc("k", "v1")), OK, OK, want)
	}
	resp := h.call(t, "test", 0, desc("k", "v1"))
	expect(t, resp, OVER, OVER, 0)
	st := resp.Statuses[0]
	if cl := st.CurrentLimit; cl == nil || cl.RequestsPerUnit != 3 || cl.Unit != rlspb.RateLimitResponse_RateLimit_SECOND {
		t.Errorf("current_limit %v, want 3/SECOND", cl)
	}
	if d := st.DurationUntilReset.AsDuration(); d != time.Second {
		t.Errorf("duration_until_reset %v, want 1s (the window ends at the next second)", d)
	}
	if header(resp, "Retry-After") == "" || header(resp, "RateLimit-Remaining") != "0" {
		t.Errorf("OVER_LIMIT headers %v", resp.ResponseHeadersToAdd)
	}
	// Another value has its own bucket; the window ends on the second.
	expect(t, h.call(t, "test", 0, desc("k", "v2")), OK, OK, 2)
	h.clock.Advance(time.Second)
	resp = h.call(t, "test", 0, desc("k", "v1"))
	expect(t, resp, OK, OK, 2)
	if header(resp, "RateLimit-Limit") != "3" || header(resp, "RateLimit-Remaining") != "2" || header(resp, "Retry-After") != "" {
		t.Errorf("OK headers %v", resp.ResponseHeadersToAdd)
	}
	// Another domain knows nothing of these limits.
	resp = h.call(t, "other", 0, desc("k", "v1"))
	expect(t, resp, OK, OK, 0)
	if resp.Statuses[0].CurrentLimit != nil || len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("unknown domain answered %v", resp)
	}
}

func TestNestedEntries(t *testing.T) {
	h := startRef(t)
	resp := h.call(t, "test", 0, desc("a", "x", "b", "u1"))
	expect(t, resp, OK, OK, 599)
	if cl := resp.Statuses[0].CurrentLimit; cl == nil || cl.Name != "ab" || cl.RequestsPerUnit != 600 || cl.Unit != rlspb.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("current_limit %v, want ab 600/MINUTE", cl)
	}
	expect(t, h.call(t, "test", 0, desc("a", "x", "b", "u2")), OK, OK, 599)
	expect(t, h.call(t, "test", 0, desc("a", "x", "b", "u1")), OK, OK, 598)
	// Only the full configured path is limited, as in the reference server.
	for _, d := range []*rlv3.RateLimitDescriptor{desc("a", "x"), desc("a", "y", "b", "u1"), desc("a", "x", "b", "u1", "c", "z"), desc("b", "u1")} {
		if resp := h.call(t, "test", 0, d); resp.OverallCode != OK || resp.Statuses[0].CurrentLimit != nil {
			t.Errorf("%v: limited: %v", d, resp)
		}
	}
}

func TestAllOrNothing(t *testing.T) {
	h := startRef(t)
	expect(t, h.call(t, "test", 3, desc("k", "v")), OK, OK, 0)
	// k=v is exhausted: the call is over the limit and big=w is not charged.
	resp := h.call(t, "test", 0, desc("k", "v"), desc("big", "w"))
	expect(t, resp, OVER, OVER, 0, OK, 100)
	resp = h.call(t, "test", 0, desc("k", "v"), desc("big", "w"), desc("a", "x", "b", "u"))
	expect(t, resp, OVER, OVER, 0, OK, 100, OK, 600)
	// A check without charging shows the bucket untouched.
	expect(t, h.call(t, "test", 0, hits(desc("big", "w"), 0)), OK, OK, 100)
	// When every descriptor fits, all are charged together.
	h.clock.Advance(time.Second)
	expect(t, h.call(t, "test", 0, desc("k", "v"), desc("big", "w")), OK, OK, 2, OK, 99)
	// The same bucket twice in one call counts twice: 2 + 2 > 3 rejects
	// both and takes nothing.
	h.clock.Advance(time.Second)
	resp = h.call(t, "test", 2, desc("k", "v"), desc("k", "v"), desc("big", "w"))
	if resp.OverallCode != OVER || resp.Statuses[2].Code != OK {
		t.Errorf("same bucket twice: %v", resp)
	}
	expect(t, h.call(t, "test", 0, hits(desc("k", "v"), 0), hits(desc("big", "w"), 0)), OK, OK, 3, OK, 99)
}

func TestHitsAddend(t *testing.T) {
	h := startRef(t)
	expect(t, h.call(t, "test", 2, desc("big", "a")), OK, OK, 98)          // the request's hits_addend
	expect(t, h.call(t, "test", 2, hits(desc("big", "a"), 5)), OK, OK, 93) // the descriptor's own wins
	expect(t, h.call(t, "test", 0, desc("big", "a")), OK, OK, 92)          // unset counts 1
	expect(t, h.call(t, "test", 7, hits(desc("big", "a"), 0)), OK, OK, 92) // 0 checks without charging
	// More than the limit can ever hold is over the limit and charges nothing.
	expect(t, h.call(t, "test", 0, hits(desc("big", "a"), 101), desc("k", "z")), OVER, OVER, 0, OK, 3)
	expect(t, h.call(t, "test", 0, hits(desc("big", "a"), 0)), OK, OK, 92)
	expect(t, h.call(t, "test", 0, hits(desc("big", "a"), 92)), OK, OK, 0)
	// A check of an exhausted bucket fails the call: nothing else is charged.
	resp := h.call(t, "test", 0, hits(desc("big", "a"), 0), desc("k", "z"))
	expect(t, resp, OVER, OVER, 0, OK, 3)
	expect(t, h.call(t, "test", 0, hits(desc("k", "z"), 0)), OK, OK, 3)
}

func TestNegativeHits(t *testing.T) {
	pol, err := envoyrls.ParseReferenceConfig("test.yaml", []byte(refYAML))
	if err != nil {
		t.Fatal(err)
	}
	pol.Settings.AllowNegativeHits = true
	h := start(t, pol)
	expect(t, h.call(t, "test", 3, desc("k", "n")), OK, OK, 0)
	// A negative hit gives tokens back, never above the limit (3 here),
	// and is never rejected.
	d := hits(desc("k", "n"), 2)
	d.IsNegativeHits = true
	expect(t, h.call(t, "test", 0, d), OK, OK, 2)
	expect(t, h.call(t, "test", 0, desc("k", "n")), OK, OK, 1)
	expect(t, h.call(t, "test", 0, desc("k", "n")), OK, OK, 0)
	expect(t, h.call(t, "test", 0, desc("k", "n")), OVER, OVER, 0)
	d = hits(desc("k", "n"), 100)
	d.IsNegativeHits = true
	expect(t, h.call(t, "test", 0, d), OK, OK, 3)
	expect(t, h.call(t, "test", 4, desc("k", "n")), OVER, OVER, 0)
	expect(t, h.call(t, "test", 0, hits(desc("k", "n"), 0)), OK, OK, 3)
}

func TestShadowMode(t *testing.T) {
	h := startRef(t)
	expect(t, h.call(t, "test", 0, desc("shadow", "s")), OK, OK, 0)
	// Over the shadow limit: still OK, and the other descriptor is charged.
	resp := h.call(t, "test", 0, desc("shadow", "s"), desc("k", "s"))
	expect(t, resp, OK, OK, 0, OK, 2)
	if cl := resp.Statuses[0].CurrentLimit; cl == nil || cl.RequestsPerUnit != 1 {
		t.Errorf("shadow current_limit %v", cl)
	}
	// Shadow limits add no headers of their own.
	if strings.Contains(header(resp, "RateLimit-Policy"), "q=1;") {
		t.Errorf("shadow limit in headers: %v", resp.ResponseHeadersToAdd)
	}
}

func TestWildcardUnlimitedZeroReplaces(t *testing.T) {
	h := startRef(t)
	// "bot*" matches every value with that prefix, one bucket per value;
	// an exact value wins over the wildcard.
	expect(t, h.call(t, "test", 2, desc("ua", "bot-1")), OK, OK, 0)
	expect(t, h.call(t, "test", 0, desc("ua", "bot-1")), OVER, OVER, 0)
	expect(t, h.call(t, "test", 0, desc("ua", "bot-2")), OK, OK, 1)
	expect(t, h.call(t, "test", 0, desc("ua", "botany")), OK, OK, 4)
	// share_threshold: every matching value shares one bucket.
	expect(t, h.call(t, "test", 2, desc("shared", "bot-1")), OK, OK, 0)
	expect(t, h.call(t, "test", 0, desc("shared", "bot-2")), OVER, OVER, 0)
	// unlimited never limits.
	resp := h.call(t, "test", 1000, desc("open", "x"))
	expect(t, resp, OK, OK, int(^uint32(0)))
	// requests_per_unit 0 rejects everything, and charges nothing else.
	expect(t, h.call(t, "test", 0, desc("zero", "x"), desc("big", "z")), OVER, OVER, 0, OK, 100)
	// replaces: q's limit replaces the limit named base when both apply.
	expect(t, h.call(t, "test", 0, desc("p", "1")), OK, OK, 0)
	resp = h.call(t, "test", 0, desc("p", "1"), desc("q", "1"))
	expect(t, resp, OK, OK, 0, OK, 4)
	if resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("replaced limit still reported: %v", resp.Statuses[0])
	}
	if cl := resp.Statuses[1].CurrentLimit; cl.GetUnitMultiplier().GetValue() != 2 || cl.Unit != rlspb.RateLimitResponse_RateLimit_HOUR {
		t.Errorf("current_limit %v, want 5 per 2 HOUR", cl)
	}
	expect(t, h.call(t, "test", 0, desc("p", "1")), OVER, OVER, 0)
}

func TestDescriptorLimitOverride(t *testing.T) {
	h := startRef(t)
	d := desc("k", "o")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
	expect(t, h.call(t, "test", 0, d), OK, OK, 0)
	expect(t, h.call(t, "test", 0, d), OVER, OVER, 0)
	// The configured 3/s limit of the same descriptor is a separate bucket.
	expect(t, h.call(t, "test", 0, desc("k", "o")), OK, OK, 2)
}

// TestAttackOverrideSharedAcrossDomains: a descriptor's limit override is
// counted per domain, as the reference server keys its buckets (the
// domain, then the entries): calls of one domain must not spend the
// override bucket that another domain's same descriptor is counted in.
func TestAttackOverrideSharedAcrossDomains(t *testing.T) {
	pol, err := envoyrls.ParseReferenceConfig("two.yaml", []byte("domain: public\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n---\ndomain: internal\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	d := desc("generic_key", "checkout")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
	expect(t, h.call(t, "public", 0, d), OK, OK, 0)
	expect(t, h.call(t, "public", 0, d), OVER, OVER, 0)
	// The internal domain's bucket of the same descriptor is untouched.
	expect(t, h.call(t, "internal", 0, d), OK, OK, 0)
}

// TestAttackDomainsShareLimitName: a limit's buckets are named by its
// domain's first 20 characters (made safe), its last key and a hash of
// its domain and path; with the hash cut to 32 bits, two domains found by
// a short birthday search (or one chosen against another's in minutes)
// got one name, and calls of one domain spent the other's buckets.
func TestAttackDomainsShareLimitName(t *testing.T) {
	const a, b = "tenant/payments-east/57836", "tenant/payments-east/74493"
	cfg := "domain: " + a + "\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 1}\n---\ndomain: " + b + "\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	pol, err := envoyrls.ParseReferenceConfig("two.yaml", []byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	d := desc("remote_address", "198.51.100.7")
	expect(t, h.call(t, a, 0, d), OK, OK, 0)
	expect(t, h.call(t, a, 0, d), OVER, OVER, 0)
	expect(t, h.call(t, b, 0, d), OK, OK, 0)
}

// TestAttackIPv6RemoteAddressMintsBuckets: Envoy's remote_address action
// sends the client's whole address, and one host commonly holds a whole
// IPv6 /64; keyed per value, a client stepping through its addresses (as
// privacy addressing does by itself) found a fresh bucket at each, in
// the reference format and in sluice's own alike. Keys hold an IPv6
// remote_address by its /64 (ipv6_prefix), as ip:address holds a peer.
func TestAttackIPv6RemoteAddressMintsBuckets(t *testing.T) {
	ref, err := envoyrls.ParseReferenceConfig("r.yaml", []byte("domain: d\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	own, err := policy.Parse("p.yaml", []byte("rules:\n  - name: per-address\n    limit_keys: [\"descriptor:remote_address\"]\n    algorithm: fixed_window\n    algorithm_config: {rate: 1, period: 1m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	whole, err := policy.Parse("w.yaml", []byte("rules:\n  - name: per-descriptor\n    limit_keys: [descriptor]\n    algorithm: fixed_window\n    algorithm_config: {rate: 1, period: 1m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pol := range []*policy.Policy{ref, own, whole} {
		h := start(t, pol)
		expect(t, h.call(t, "d", 0, desc("remote_address", "2001:db8:1:2::1")), OK, OK, 0)
		expect(t, h.call(t, "d", 0, desc("remote_address", "2001:db8:1:2:a:b:c:d")), OVER, OVER, 0)
		expect(t, h.call(t, "d", 0, desc("remote_address", "2001:db8:1:3::1")), OK, OK, 0)
		expect(t, h.call(t, "d", 0, desc("remote_address", "198.51.100.7")), OK, OK, 0)
		expect(t, h.call(t, "d", 0, desc("remote_address", "198.51.100.8")), OK, OK, 0)
	}
}

// ruleNames records the rule names a server reports decisions of.
type ruleNames map[string]bool

func (r ruleNames) Observe(rule, _ string) { r[rule] = true }

// TestAttackOverridesMintRuleNames: a descriptor's limit override is
// counted in a bucket of its own for each requests_per_unit, but its
// decisions are reported under one rule per domain and unit: the metrics
// and the live page keep a series per rule name forever, so a caller
// varying requests_per_unit would grow them, and the server, without
// bound.
func TestAttackOverridesMintRuleNames(t *testing.T) {
	pol, err := envoyrls.ParseReferenceConfig("o.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	names := ruleNames{}
	s := envoyrls.New(pol, sluice.New(memory.New(memory.Options{})), envoyrls.Options{Observer: names, StoreTimeout: time.Minute})
	for rpu := uint32(1); rpu <= 50; rpu++ {
		d := desc("k", "v")
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_MINUTE}
		for range 2 { // the second call of 1 per minute is over the limit: separate buckets still
			if _, err := s.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{d}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(names) != 1 {
		t.Fatalf("50 overrides reported under %d rule names, want 1", len(names))
	}
	h := start(t, pol)
	d := desc("k", "v")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
	expect(t, h.call(t, "d", 0, d), OK, OK, 0)
	d.Limit.RequestsPerUnit = 2 // another override: its own bucket
	expect(t, h.call(t, "d", 0, d), OK, OK, 1)
	d.Limit.RequestsPerUnit = 1
	expect(t, h.call(t, "d", 0, d), OVER, OVER, 0)
}

// TestAttackShareThresholdParentWildcard: share_threshold on a wildcard
// whose limit is on a nested descriptor counts every matching value in
// one bucket, as the reference server does; counted per value, a client
// varying the value (a path under api/*) gets a fresh bucket each time.
func TestAttackShareThresholdParentWildcard(t *testing.T) {
	pol, err := envoyrls.ParseReferenceConfig("share.yaml", []byte("domain: d\ndescriptors:\n  - key: route\n    value: api/*\n    share_threshold: true\n    descriptors:\n      - key: method\n        rate_limit: {unit: minute, requests_per_unit: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	expect(t, h.call(t, "d", 0, desc("route", "api/1", "method", "GET")), OK, OK, 1)
	expect(t, h.call(t, "d", 0, desc("route", "api/2", "method", "GET")), OK, OK, 0)
	expect(t, h.call(t, "d", 0, desc("route", "api/3", "method", "GET")), OVER, OVER, 0)
	// The nested entry still counts per value.
	expect(t, h.call(t, "d", 0, desc("route", "api/4", "method", "POST")), OK, OK, 1)
}

// TestAttackWildcardInsideValue: a '*' anywhere in a configured value is
// a wildcard to the reference server, standing for any run of bytes
// ("/api/*/upload", "svc*ep*rpc"); read as a literal value, such a limit
// holds no request that the reference server limits with it.
func TestAttackWildcardInsideValue(t *testing.T) {
	cfg := "domain: d\ndescriptors:\n  - key: path\n    value: /api/*/upload\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: route\n    value: svc*ep*rpc\nSHARE    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	pol, err := envoyrls.ParseReferenceConfig("mid.yaml", []byte(strings.Replace(cfg, "SHARE", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	expect(t, h.call(t, "d", 0, desc("path", "/api/v1/upload")), OK, OK, 0)
	expect(t, h.call(t, "d", 0, desc("path", "/api/v1/upload")), OVER, OVER, 0)
	expect(t, h.call(t, "d", 0, desc("path", "/api/v2/upload")), OK, OK, 0)
	expect(t, h.call(t, "d", 0, desc("route", "svc-a-ep-b-rpc")), OK, OK, 0)
	expect(t, h.call(t, "d", 0, desc("route", "svc-a-ep-b-rpc")), OVER, OVER, 0)
	// Not matching: no limit applies.
	resp := h.call(t, "d", 0, desc("route", "svc-rpc"), desc("path", "/api/upload"))
	expect(t, resp, OK, OK, 0, OK, 0)
	if resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit != nil {
		t.Errorf("a value the wildcards do not match is limited: %v", resp.Statuses)
	}
	// share_threshold counts every value such a wildcard matches as one.
	pol, err = envoyrls.ParseReferenceConfig("mid.yaml", []byte(strings.Replace(cfg, "SHARE", "    share_threshold: true\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	h = start(t, pol)
	expect(t, h.call(t, "d", 0, desc("route", "svc-a-ep-b-rpc")), OK, OK, 0)
	expect(t, h.call(t, "d", 0, desc("route", "svceprpc")), OVER, OVER, 0)
}

func TestStoreDownAllows(t *testing.T) {
	h := startRef(t)
	h.store.Down.Store(true)
	// The reference format's rules follow on_store_error: allow.
	for i := 0; i < 5; i++ {
		expect(t, h.call(t, "test", 0, desc("k", "down")), OK, OK, 3)
	}
	// An outage is logged, but not once per call (a second may turn over
	// between the calls: at most two lines).
	if n := strings.Count(h.logs.String(), "store error"); n < 1 || n > 2 {
		t.Errorf("%d store error lines for 5 failed calls, want 1 (at most 2):\n%s", n, h.logs.String())
	}
	h.store.Down.Store(false)
	expect(t, h.call(t, "test", 0, desc("k", "down")), OK, OK, 2) // nothing was charged meanwhile
}

func TestInvalidRequests(t *testing.T) {
	h := startRef(t)
	for name, req := range map[string]*rlspb.RateLimitRequest{
		"no domain":      {Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}},
		"no descriptors": {Domain: "test"},
		"empty entries":  {Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{{}}},
		"empty key":      {Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{desc("", "v")}},
		"huge value":     {Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", strings.Repeat("x", 5000))}},
	} {
		_, err := h.rls.ShouldRateLimit(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

func TestHealthAndReflection(t *testing.T) {
	h := startRef(t)
	for _, svc := range []string{"", envoyrls.ServiceName} {
		resp, err := healthpb.NewHealthClient(h.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v", svc, resp, err)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range resp.GetListServicesResponse().GetService() {
		found = found || s.Name == envoyrls.ServiceName
	}
	if !found {
		t.Errorf("reflection lists %v, want %s", resp.GetListServicesResponse(), envoyrls.ServiceName)
	}
	stream.CloseSend()
}

// Attack: a hits_addend above what a limit can ever hold was answered
// OVER_LIMIT with a Retry-After, and the reason of an ordinary rejection:
// an Envoy (or a client) that obeys it retries forever. The protocol has
// no other code than OVER_LIMIT; the answer carries no Retry-After and
// says cost_exceeds_limit.
func TestAttackCostNeverGrantedHasNoRetryAfter(t *testing.T) {
	h := startRef(t)
	resp := h.call(t, "test", 0, hits(desc("big", "a"), 101))
	expect(t, resp, OVER, OVER, 0)
	hdr := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		hdr[strings.ToLower(hv.Key)] = hv.Value
	}
	if ra, ok := hdr["retry-after"]; ok || hdr["x-sluice-reason"] != "cost_exceeds_limit" {
		t.Errorf("a cost no wait admits: Retry-After %q (set %v), reason %q; want none and cost_exceeds_limit", ra, ok, hdr["x-sluice-reason"])
	}
	// An ordinary rejection still says when to come back.
	expect(t, h.call(t, "test", 0, hits(desc("big", "a"), 100)), OK, OK, 0)
	resp = h.call(t, "test", 0, desc("big", "a"))
	expect(t, resp, OVER, OVER, 0)
	found := false
	for _, hv := range resp.ResponseHeadersToAdd {
		found = found || strings.EqualFold(hv.Key, "Retry-After")
	}
	if !found {
		t.Errorf("an exhausted bucket's rejection has no Retry-After: %v", resp.ResponseHeadersToAdd)
	}
}

// negative is d marked is_negative_hits with n hits.
func negative(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d = hits(d, n)
	d.IsNegativeHits = true
	return d
}

// Attack: any caller that reaches the gRPC service refills an exhausted
// bucket (its own, or anyone's it can name) with is_negative_hits and a
// large hits_addend, then spends it again: the limit never holds. Refunds
// are refused unless the configuration says allow_negative_hits, and a
// refused call charges and refunds nothing.
func TestAttackNegativeHitsRefillBucket(t *testing.T) {
	for name, h := range map[string]*harness{"reference format": startRef(t), "sluice format": startSluice(t)} {
		t.Run(name, func(t *testing.T) {
			// The victim's limit and the bystander's, whose capacity is room.
			domain, vk, ok, burst, room := "test", "k", "big", 3, 100
			if name == "sluice format" {
				domain, vk, ok, burst, room = "edge", "client", "client", 5, 5
			}
			victim := func() *rlv3.RateLimitDescriptor { return desc(vk, "victim") }
			other := func() *rlv3.RateLimitDescriptor { return desc(ok, "bystander") }
			expect(t, h.call(t, domain, uint32(burst), victim()), OK, OK, 0)
			for _, req := range [][]*rlv3.RateLimitDescriptor{
				{negative(victim(), 1_000_000)},
				{other(), negative(victim(), 1_000_000)}, // hidden behind an ordinary descriptor
				{negative(victim(), 0)},
			} {
				_, err := h.rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: domain, Descriptors: req})
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "allow_negative_hits") {
					t.Fatalf("a refund from the caller: %v, want InvalidArgument naming allow_negative_hits", err)
				}
			}
			// Nothing was refunded, and the ordinary descriptor of the
			// refused call was not charged.
			expect(t, h.call(t, domain, 0, victim()), OVER, OVER, 0)
			expect(t, h.call(t, domain, 0, hits(other(), 0)), OK, OK, room)
		})
	}
}

// With allow_negative_hits the refund is honoured, never above the limit.
func TestNegativeHitsAllowedBySluicePolicy(t *testing.T) {
	pol, err := policy.Parse("sluice.yaml", []byte("allow_negative_hits: true\n"+sluiceYAML))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	expect(t, h.call(t, "edge", 5, desc("client", "c")), OK, OK, 0)
	expect(t, h.call(t, "edge", 0, negative(desc("client", "c"), 2)), OK, OK, 2)
	expect(t, h.call(t, "edge", 0, negative(desc("client", "c"), 1000)), OK, OK, 5)
}

// TestAttackHTTPRuleSharedOverEnvoy: a file's per-address rule for HTTP
// (ip:address), served on the default gRPC listener too, met every Envoy
// descriptor with its address absent: all of them, whatever the domain,
// shared its one (absent) bucket, and one client behind Envoy used it up
// for every other. A rule keyed only on what Envoy never sends does not
// apply to Envoy's calls.
func TestAttackHTTPRuleSharedOverEnvoy(t *testing.T) {
	pol, err := policy.Parse("p.yaml", []byte(`
rules:
  - name: per-ip-http
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 1}
  - name: per-key-http
    limit_keys: ["header:x-api-key", "path"]
    algorithm_config: {rps: 1, burst: 1}
  - name: per-ip
    match: {domain: edge}
    limit_keys: ["descriptor:remote_address"]
    algorithm_config: {rps: 1, burst: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	expect(t, h.call(t, "edge", 0, desc("remote_address", "192.0.2.1")), OK, OK, 0)
	expect(t, h.call(t, "other", 0, desc("remote_address", "192.0.2.2")), OK)
	expect(t, h.call(t, "edge", 0, desc("remote_address", "192.0.2.3")), OK, OK, 0)
	expect(t, h.call(t, "edge", 0, desc("remote_address", "192.0.2.1")), OVER, OVER, 0)
}
