package xds_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/envoyrls/xds"
	"github.com/sluicehq/sluice/internal/lockedbuf"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/redis"
)

var t0 = time.Date(2030, 1, 7, 12, 0, 0, 0, time.UTC) // a Monday noon: inside one window of every unit

// controlPlane is go-control-plane's xDS server on its snapshot cache, as
// Envoy Gateway runs it, on a loopback port; nacks counts the NACKs it
// received.
type controlPlane struct {
	cache cache.SnapshotCache
	addr  string
	g     *grpc.Server
	nacks atomic.Int64
	acks  atomic.Int64
}

func startControlPlane(t *testing.T, addr string) *controlPlane {
	t.Helper()
	cp := &controlPlane{cache: cache.NewSnapshotCache(true, cache.IDHash{}, nil)}
	cp.listen(t, addr)
	return cp
}

func (cp *controlPlane) listen(t *testing.T, addr string) {
	t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port of a stopped server may linger a moment
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	cb := server.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
		if r.GetErrorDetail() != nil {
			cp.nacks.Add(1)
		} else if r.GetResponseNonce() != "" {
			cp.acks.Add(1)
		}
		return nil
	}}
	srv := server.NewServer(context.Background(), cp.cache, cb)
	cp.g = grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(cp.g, srv)
	cp.addr = ln.Addr().String()
	go cp.g.Serve(ln)
	t.Cleanup(cp.g.Stop)
}

func (cp *controlPlane) push(t *testing.T, node, version string, cfgs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	rs := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		rs[i] = c
	}
	snap, err := cache.NewSnapshot(version, map[string][]types.Resource{xds.TypeURL: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// node builds a descriptor of Envoy Gateway's translator output: key,
// value, a limit (rpu 0: none) and children.
func node(key, value string, rpu uint32, unit rlsconf.RateLimitUnit, children ...*rlsconf.RateLimitDescriptor) *rlsconf.RateLimitDescriptor {
	d := &rlsconf.RateLimitDescriptor{Key: key, Value: value, Descriptors: children}
	if rpu > 0 {
		d.RateLimit = &rlsconf.RateLimitPolicy{RequestsPerUnit: rpu, Unit: unit, Replaces: []*rlsconf.RateLimitReplace{}}
	}
	return d
}

// listener is Envoy Gateway's per-listener resource: a route with a
// Distinct header rule (a limit per value of x-user), an Exact header
// rule with a source CIDR (masked_remote_address), and a method rule.
func listener(userLimit uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{
		node("httproute/default/backend/rule/0/match/0/www_example_com", "httproute/default/backend/rule/0/match/0/www_example_com", 0, 0,
			node("rule-0-match-0", "", userLimit, rlsconf.RateLimitUnit_MINUTE),
			node("rule-1-match-0", "rule-1-match-0", 0, 0,
				node("masked_remote_address", "10.0.0.0/8", 1, rlsconf.RateLimitUnit_HOUR)),
			node("rule-2-match-0", "rule-2-match-0", 2, rlsconf.RateLimitUnit_WEEK)),
	}}
}

// shared is a shared (policy-wide) limit's resource, charged by hits_addend.
func shared() *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: "default/shared-policy", Domain: "default/shared-policy", Descriptors: []*rlsconf.RateLimitDescriptor{
		node("default/shared-policy/rule/0", "default/shared-policy/rule/0", 0, 0,
			node("rule-0-match-0", "rule-0-match-0", 10, rlsconf.RateLimitUnit_DAY)),
	}}
}

const routeKey = "httproute/default/backend/rule/0/match/0/www_example_com"

func user(u string) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: routeKey, Value: routeKey}, {Key: "rule-0-match-0", Value: u}}}
}

func cidr() *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: routeKey, Value: routeKey}, {Key: "rule-1-match-0", Value: "rule-1-match-0"}, {Key: "masked_remote_address", Value: "10.0.0.0/8"}}}
}

func sharedDesc(cost uint64) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "default/shared-policy/rule/0", Value: "default/shared-policy/rule/0"}, {Key: "rule-0-match-0", Value: "rule-0-match-0"}}, HitsAddend: wrapperspb.UInt64(cost)}
}

// rig is sluice's Envoy service following a control plane through a
// Client, as sluice serve runs them.
type rig struct {
	client *xds.Client
	pol    atomic.Pointer[policy.Policy]
	rls    rlspb.RateLimitServiceClient
	logs   *lockedbuf.Buffer
}

func startRig(t *testing.T, cp *controlPlane, store sluice.Store, clock sluice.Clock) *rig {
	t.Helper()
	r := &rig{logs: new(lockedbuf.Buffer)}
	log := slog.New(slog.NewTextHandler(r.logs, nil))
	r.client = xds.New(xds.Config{Server: cp.addr, NodeID: "envoy-gateway-ratelimit",
		Backoff: xds.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond, RandomFactor: 0.5, Jitter: true}, ConnectRetryInterval: 5 * time.Millisecond}, policy.Default().Settings, log)
	init, err := r.client.Initial()
	if err != nil {
		t.Fatal(err)
	}
	r.pol.Store(init)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { r.client.Run(ctx); done <- struct{}{} }()
	go func() {
		policy.Watch(ctx, r.client, nil, func(p *policy.Policy) { r.pol.Store(p) }, func(policy.Reload) {})
		done <- struct{}{}
	}()
	t.Cleanup(func() { cancel(); <-done; <-done })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(envoyrls.ServerOptions()...)
	envoyrls.New(init, sluice.NewWithOptions(store, sluice.Options{Clock: clock}), envoyrls.Options{Logger: log, StoreTimeout: time.Minute, Source: r.pol.Load}).Register(g)
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.rls = rlspb.NewRateLimitServiceClient(conn)
	return r
}

var waitLimit = time.Minute

// waitFor polls cond (bounded: a minute) for what a stream brings.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitVersion waits for version's snapshot to be applied and in force.
func (r *rig) waitVersion(t *testing.T, version string) {
	t.Helper()
	waitFor(t, "version "+version, func() bool {
		ok := r.client.Status().Version == version && strings.HasSuffix(r.pol.Load().Source, "@"+version)
		if !ok && testing.Verbose() {
			t.Logf("status %+v source %q\n%s", r.client.Status(), r.pol.Load().Source, r.logs.String())
		}
		return ok
	})
}

func (r *rig) code(t *testing.T, domain string, ds ...*rlv3.RateLimitDescriptor) string {
	t.Helper()
	resp, err := r.rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.GetOverallCode().String()
}

// admits counts the calls admitted of n.
func (r *rig) admits(t *testing.T, n int, domain string, ds ...*rlv3.RateLimitDescriptor) int {
	t.Helper()
	ok := 0
	for i := 0; i < n; i++ {
		if r.code(t, domain, ds...) == "OK" {
			ok++
		}
	}
	return ok
}

// ruleset runs the Envoy Gateway rules through snapshots on store.
func ruleset(t *testing.T, store sluice.Store, clock sluice.Clock) {
	cp := startControlPlane(t, "127.0.0.1:0")
	r := startRig(t, cp, store, clock)
	if err := r.client.Ready(); err == nil {
		t.Fatal("ready before the first snapshot")
	}
	const dom, sharedDom = "default/eg/http", "default/shared-policy"
	cp.push(t, "envoy-gateway-ratelimit", "1", listener(2), shared())
	r.waitVersion(t, "1")
	if err := r.client.Ready(); err != nil {
		t.Fatalf("not ready after the first snapshot: %v", err)
	}
	// Distinct header: a bucket per value.
	if n := r.admits(t, 3, dom, user("alice")); n != 2 {
		t.Fatalf("alice admitted %d of 3 under 2/min", n)
	}
	if n := r.admits(t, 1, dom, user("bob")); n != 1 {
		t.Fatalf("bob admitted %d", n)
	}
	// Exact header plus source CIDR: one bucket for the whole range.
	if n := r.admits(t, 2, dom, cidr()); n != 1 {
		t.Fatalf("10.0.0.0/8 admitted %d of 2 under 1/hour", n)
	}
	// Shared limit charged through hits_addend.
	if c := r.code(t, sharedDom, sharedDesc(4)) + r.code(t, sharedDom, sharedDesc(4)) + r.code(t, sharedDom, sharedDesc(4)); c != "OKOKOVER_LIMIT" {
		t.Fatalf("shared 10/day at cost 4: %s", c)
	}

	// The same limits in another order, beside a new resource: every
	// bucket is kept.
	other := &rlsconf.RateLimitConfig{Name: "default/other", Domain: "default/other", Descriptors: []*rlsconf.RateLimitDescriptor{node("generic_key", "x", 1, rlsconf.RateLimitUnit_SECOND)}}
	cp.push(t, "envoy-gateway-ratelimit", "2", other, shared(), listener(2))
	r.waitVersion(t, "2")
	if c := r.code(t, dom, user("alice")); c != "OVER_LIMIT" {
		t.Fatalf("alice after a reordering snapshot: %s (bucket lost)", c)
	}
	if c := r.code(t, dom, cidr()); c != "OVER_LIMIT" {
		t.Fatalf("the CIDR after a reordering snapshot: %s (bucket lost)", c)
	}
	if c := r.code(t, sharedDom, sharedDesc(4)) + r.code(t, sharedDom, sharedDesc(2)); c != "OVER_LIMITOK" {
		t.Fatalf("shared after a reordering snapshot: %s (want 8 of 10 kept: cost 4 over, cost 2 ok)", c)
	}

	// An invalid snapshot (a limit without a unit) is refused whole:
	// the last good policy serves, the refusal is logged and counted
	// once however often the control plane resends it.
	bad := listener(100)
	bad.Descriptors[0].Descriptors[2].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	cp.push(t, "envoy-gateway-ratelimit", "3", bad, shared())
	waitFor(t, "three NACKs of version 3", func() bool { return cp.nacks.Load() >= 3 })
	st := r.client.Status()
	if st.Version != "2" || st.Rejected != 1 || !strings.Contains(st.LastError, "invalid rate limit unit") {
		t.Fatalf("after a refused snapshot: %+v", st)
	}
	if n := strings.Count(r.logs.String(), "snapshot refused"); n != 1 {
		t.Fatalf("the refusal logged %d times:\n%s", n, r.logs.String())
	}
	if c := r.code(t, dom, user("alice")); c != "OVER_LIMIT" {
		t.Fatalf("alice while a bad snapshot is refused: %s (the bad one's 100/min applied?)", c)
	}

	// The control plane's fix applies.
	cp.push(t, "envoy-gateway-ratelimit", "4", listener(2), shared())
	r.waitVersion(t, "4")
	if n := r.admits(t, 1, dom, user("carol")); n != 1 {
		t.Fatalf("carol admitted %d after the fix", n)
	}
	if c := r.code(t, dom, user("alice")); c != "OVER_LIMIT" {
		t.Fatalf("alice after the fix: %s", c)
	}
}

func TestXDSEnvoyGatewaySnapshotsMemory(t *testing.T) {
	clock := sluice.NewManualClock(t0)
	ruleset(t, memory.New(memory.Options{Clock: clock}), clock)
}

// TestXDSSnapshotOverMaxRecvBytes: by default a snapshot is bounded as
// the reference server's client bounds it (grpc-go's 4 MiB), so that the
// memory a control plane can make sluice compile is what the reference
// would: one beyond it is never compiled, the last good policy keeps
// serving, and the client's status says why.
func TestXDSSnapshotOverMaxRecvBytes(t *testing.T) {
	clock := sluice.NewManualClock(t0)
	cp := startControlPlane(t, "127.0.0.1:0")
	r := startRig(t, cp, memory.New(memory.Options{Clock: clock}), clock)
	cp.push(t, "envoy-gateway-ratelimit", "1", listener(2))
	r.waitVersion(t, "1")
	big := &rlsconf.RateLimitConfig{Name: "default/big", Domain: "default/big"}
	for i := range 5 << 10 { // 5,120 descriptors of over 1 KiB: over 5 MiB
		big.Descriptors = append(big.Descriptors, node("k", fmt.Sprintf("%s%d", strings.Repeat("v", 1<<10), i), 1, rlsconf.RateLimitUnit_SECOND))
	}
	cp.push(t, "envoy-gateway-ratelimit", "2", listener(2), big)
	waitFor(t, "the stream to end on the 5 MiB snapshot", func() bool {
		st := r.client.Status()
		return st.Version == "2" || st.Reconnects > 0 && strings.Contains(st.LastError, "larger than max")
	})
	if st := r.client.Status(); st.Version != "1" || !strings.HasSuffix(r.pol.Load().Source, "@1") {
		t.Fatalf("a 5 MiB snapshot was taken: status %+v, serving %s", st, r.pol.Load().Source)
	}
}

func TestXDSEnvoyGatewaySnapshotsRedis(t *testing.T) {
	addr := redistest.Server(t)
	clock := sluice.NewManualClock(t0)
	store, err := redis.Open(fmt.Sprintf("redis://%s/0?timeout=1m&dial_timeout=1m&write_timeout=1m&key_prefix=xds%d:", addr, time.Now().UnixNano()), redis.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ruleset(t, store, clock)
}

// changedLimit: a snapshot that changes a limit's requests_per_unit
// under the same descriptors keeps the window's count, as the reference
// counts hits per window and compares them with the limit of the moment:
// 3/min used up, raised to 5/min, admits exactly 2 more in the window;
// 5/min with 3 used, lowered to 2/min, admits none; the next window
// counts under the new limit.
func changedLimit(t *testing.T, store sluice.Store, clock *sluice.ManualClock) {
	cp := startControlPlane(t, "127.0.0.1:0")
	r := startRig(t, cp, store, clock)
	const dom = "default/eg/http"
	cp.push(t, "envoy-gateway-ratelimit", "1", listener(3))
	r.waitVersion(t, "1")
	if n := r.admits(t, 4, dom, user("alice")); n != 3 {
		t.Fatalf("alice admitted %d of 4 under 3/min", n)
	}
	cp.push(t, "envoy-gateway-ratelimit", "2", listener(5))
	r.waitVersion(t, "2")
	if n := r.admits(t, 4, dom, user("alice")); n != 2 {
		t.Fatalf("alice admitted %d of 4 after 3/min, used up, became 5/min: want 2", n)
	}
	if n := r.admits(t, 3, dom, user("bob")); n != 3 {
		t.Fatalf("bob admitted %d of 3 under 5/min", n)
	}
	cp.push(t, "envoy-gateway-ratelimit", "3", listener(2))
	r.waitVersion(t, "3")
	if n := r.admits(t, 3, dom, user("bob")); n != 0 {
		t.Fatalf("bob admitted %d after 5/min became 2/min with 3 used: want none", n)
	}
	clock.Advance(time.Minute)
	if n := r.admits(t, 3, dom, user("bob")); n != 2 {
		t.Fatalf("bob admitted %d of 3 in the next window under 2/min", n)
	}
}

func TestXDSChangedLimitKeepsWindowCountMemory(t *testing.T) {
	clock := sluice.NewManualClock(t0)
	changedLimit(t, memory.New(memory.Options{Clock: clock}), clock)
}

func TestXDSChangedLimitKeepsWindowCountRedis(t *testing.T) {
	addr := redistest.Server(t)
	clock := sluice.NewManualClock(t0)
	store, err := redis.Open(fmt.Sprintf("redis://%s/0?timeout=1m&dial_timeout=1m&write_timeout=1m&key_prefix=xdschange%d:", addr, time.Now().UnixNano()), redis.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	changedLimit(t, store, clock)
}

// TestXDSControlPlaneRestart: a lost control plane leaves the last
// applied policy serving; the client comes back to a restarted one on its
// own, naming the version it applied.
func TestXDSControlPlaneRestart(t *testing.T) {
	clock := sluice.NewManualClock(t0)
	cp := startControlPlane(t, "127.0.0.1:0")
	r := startRig(t, cp, memory.New(memory.Options{Clock: clock}), clock)
	cp.push(t, "envoy-gateway-ratelimit", "1", listener(2))
	r.waitVersion(t, "1")
	const dom = "default/eg/http"
	r.admits(t, 2, dom, user("alice"))
	cp.g.Stop()
	waitFor(t, "the client to see the control plane lost", func() bool { return !r.client.Status().Connected })
	if c := r.code(t, dom, user("alice")); c != "OVER_LIMIT" {
		t.Fatalf("alice with the control plane gone: %s", c)
	}
	if err := r.client.Ready(); err != nil {
		t.Fatalf("unready with the control plane gone (unready_when_lost is off): %v", err)
	}
	// A restarted control plane, with a fresh cache, on the same address.
	cp2 := &controlPlane{cache: cache.NewSnapshotCache(true, cache.IDHash{}, nil)}
	cp2.push(t, "envoy-gateway-ratelimit", "7", listener(2))
	cp2.listen(t, cp.addr)
	// The same limits under the restarted server's version: acknowledged,
	// nothing reinstalled.
	waitFor(t, "version 7", func() bool { return r.client.Status().Version == "7" })
	if c := r.code(t, dom, user("alice")); c != "OVER_LIMIT" {
		t.Fatalf("alice after the control plane came back: %s (bucket lost)", c)
	}
	if st := r.client.Status(); !st.Connected || st.Reconnects == 0 || st.Updates != 1 {
		t.Fatalf("status after reconnecting: %+v", st)
	}
	cp2.push(t, "envoy-gateway-ratelimit", "8", listener(3))
	r.waitVersion(t, "8")
	if n := r.admits(t, 1, dom, user("dave")); n != 1 {
		t.Fatalf("dave admitted %d under the restarted server's snapshot", n)
	}
}

// Ready waits for the applied snapshot to be taken by Load, which serve
// installs as it returns: on Applied alone, /readyz said ready while the
// watcher had yet to take it, and a call let in then was decided by the
// empty policy of the start (TestServeXDSReferenceEnv saw OK twice under
// 1 a year).
func TestReadyOnceTaken(t *testing.T) {
	cp := startControlPlane(t, "127.0.0.1:0")
	c := xds.New(xds.Config{Server: cp.addr, NodeID: "envoy-gateway-ratelimit",
		Backoff: xds.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}, ConnectRetryInterval: 5 * time.Millisecond},
		policy.Default().Settings, slog.New(slog.DiscardHandler))
	if _, err := c.Initial(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	cp.push(t, "envoy-gateway-ratelimit", "1", listener(2))
	waitFor(t, "the snapshot applied", func() bool { return c.Status().Applied })
	if err := c.Ready(); err == nil {
		t.Fatal("ready with the snapshot applied but not yet taken by Load")
	}
	if p, err := c.Load(ctx, false); err != nil || p == nil {
		t.Fatalf("Load: %v, %v; want the applied snapshot", p, err)
	}
	if err := c.Ready(); err != nil {
		t.Fatalf("not ready once the snapshot was taken: %v", err)
	}
}
