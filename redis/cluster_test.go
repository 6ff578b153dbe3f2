package redis_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/redis"
)

func slotOf(t testing.TB, c rueidis.Client, key string) uint16 {
	t.Helper()
	cmd := c.B().Get().Key(key).Build()
	return cmd.Slot()
}

// A rejected TakeAll across slots charges the earlier slots, then refunds
// them: once the refunds have landed, every bucket answers, and is stored,
// exactly as before.
func TestClusterTakeAllRefund(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(5_000_000_000_000))
	s := open(t, clusterURL(t), redis.Options{Clock: clock, NoOverLimitCache: true})
	c := s.Client()
	if c.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("client mode %s, want cluster", c.Mode())
	}
	ctx := context.Background()
	start := time.Duration(0)
	limits := []*sluice.Limit{
		uniqueLimit(t, sluice.Spec{Name: "ref-tb", TokensPerSecond: 10, Burst: 10, MaxReserved: 3}),
		uniqueLimit(t, sluice.Spec{Name: "ref-fw", Algorithm: sluice.FixedWindow, Rate: 5, Period: time.Second, Start: &start}),
		uniqueLimit(t, sluice.Spec{Name: "ref-sl", Algorithm: sluice.SlidingLog, Rate: 4, Period: time.Second}),
		uniqueLimit(t, sluice.Spec{Name: "ref-tb2", TokensPerSecond: 1, Burst: 3}),
		uniqueLimit(t, sluice.Spec{Name: "ref-sw", Algorithm: sluice.SlidingWindow, Rate: 4, Period: time.Second}),
		uniqueLimit(t, sluice.Spec{Name: "ref-cw", Algorithm: sluice.FixedWindow, Rate: 4, Calendar: sluice.CalendarDay}),
	}
	var reqs []sluice.Request
	var keys []string
	slots := map[uint16]bool{}
	last := 0
	for i, l := range limits {
		reqs = append(reqs, sluice.Request{Limit: l, Key: "x", Cost: 1})
		keys = append(keys, l.StorageKey("x"))
		slot := slotOf(t, c, keys[i])
		slots[slot] = true
		if slot > slotOf(t, c, keys[last]) {
			last = i
		}
	}
	if len(slots) < 3 {
		t.Skipf("keys fell in %d slots; the test needs several", len(slots))
	}
	// Some state in every bucket, then drain the one charged last.
	if ds, err := conformance.TakeAll(ctx, s, engine.OpTake, reqs, nil); err != nil || !sluice.Combine(ds).Allowed {
		t.Fatalf("first TakeAll: %v %+v", err, ds)
	}
	for {
		d, err := conformance.Take(ctx, s, engine.OpTake, reqs[last])
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
	}
	raw := func() []string {
		out := make([]string, len(keys))
		for i, k := range keys {
			v, err := c.Do(ctx, c.B().Get().Key(k).Build()).ToString()
			if err != nil && !rueidis.IsRedisNil(err) {
				t.Fatal(err)
			}
			out[i] = v
		}
		return out
	}
	before, err := conformance.TakeAll(ctx, s, engine.OpPeek, reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	rawBefore := raw()
	ds, err := conformance.TakeAll(ctx, s, engine.OpTake, reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sluice.Combine(ds).Allowed {
		t.Fatal("TakeAll admitted although one bucket is empty")
	}
	for i, d := range ds {
		if d.Allowed {
			t.Fatalf("decision %d of a rejected TakeAll is allowed", i)
		}
	}
	after, err := conformance.TakeAll(ctx, s, engine.OpPeek, reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	rawAfter := raw()
	for i := range reqs {
		if before[i].Tokens != after[i].Tokens || before[i].ResetAfter != after[i].ResetAfter || before[i].RetryAfter != after[i].RetryAfter {
			t.Errorf("%s: before %+v after %+v", limits[i].Name(), before[i], after[i])
		}
		if rawBefore[i] != rawAfter[i] {
			t.Errorf("%s: stored state changed: %q -> %q", limits[i].Name(), rawBefore[i], rawAfter[i])
		}
	}
	// A hash tag puts one identity's buckets in one slot: one script.
	a, b := limits[0].StorageKey("{user-42}"), limits[3].StorageKey("{user-42}")
	if slotOf(t, c, a) != slotOf(t, c, b) {
		t.Fatal("hash-tagged keys in different slots")
	}
}

// A rejected TakeAll across slots refunds the slot it charged first,
// unless that charge left a bucket in debt and a reservation came after
// it: that reservation was told a turn counting the charge, and a refund
// from under it would give the next reservation the same turn. With no
// charge after it, the refund lands as always.
func TestClusterRollbackKeepsReservationTurns(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(6_000_000_000_000))
	s := open(t, clusterURL(t), redis.Options{Clock: clock, NoOverLimitCache: true})
	c := s.Client()
	ctx := context.Background()
	turns := uniqueLimit(t, sluice.Spec{Name: "turns", TokensPerSecond: 1, Burst: 2, MaxReserved: 20})
	gate := uniqueLimit(t, sluice.Spec{Name: "gate", TokensPerSecond: 1, Burst: 1})
	// The reservations' bucket in a low slot, the gate in a higher one, so
	// that the TakeAll charges the bucket first and the gate rejects.
	key, gateKey := "", ""
	for i := 0; key == "" || gateKey == ""; i++ {
		k := "k" + strconv.Itoa(i)
		switch slot := slotOf(t, c, turns.StorageKey(k)); {
		case key == "" && slot < 4000:
			key = k
		case key != "" && slotOf(t, c, gate.StorageKey(k)) > 12000:
			gateKey = k
		}
	}
	take := func(lim *sluice.Limit, k string, cost float64, reserve bool) sluice.Decision {
		t.Helper()
		d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: k, Cost: cost, Reserve: reserve})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	take(turns, key, 2, false)
	if d := take(turns, key, 2, true); !d.Allowed || d.RetryAfter != 2*time.Second {
		t.Fatalf("reservation into debt: %+v, want a turn in 2s", d)
	}
	take(gate, gateKey, 1, false) // the gate is empty
	both := []sluice.Request{{Limit: turns, Key: key, Cost: 1, Reserve: true}, {Limit: gate, Key: gateKey, Cost: 1}}

	var between sluice.Decision
	redis.SetBeforeRollback(s, func() { between = take(turns, key, 1, true) })
	ds, err := conformance.TakeAll(ctx, s, engine.OpTake, both, nil)
	if err != nil || sluice.Combine(ds).Allowed {
		t.Fatalf("TakeAll past an empty gate: %+v, %v; want rejected", ds, err)
	}
	if !between.Allowed || between.RetryAfter != 4*time.Second {
		t.Fatalf("reservation between the charge and its refund: %+v, want a turn in 4s (after the charge)", between)
	}
	if next := take(turns, key, 1, true); !next.Allowed || next.RetryAfter != 5*time.Second {
		t.Errorf("next reservation: turn in %v, want 5s: one token after the one before it, not with it", next.RetryAfter)
	}

	// Nothing in between: the charges are refunded, the bucket as it was,
	// also when one TakeAll charged it twice (the later charge refunded
	// first, so that each refund finds the bucket where its charge left it).
	redis.SetBeforeRollback(s, nil)
	for _, rs := range [][]sluice.Request{both, {both[0], both[0], both[1]}} {
		before, err := conformance.TakeAll(ctx, s, engine.OpPeek, both[:1], nil)
		if err != nil {
			t.Fatal(err)
		}
		if ds, err := conformance.TakeAll(ctx, s, engine.OpTake, rs, nil); err != nil || sluice.Combine(ds).Allowed {
			t.Fatalf("TakeAll past an empty gate: %+v, %v; want rejected", ds, err)
		}
		after, err := conformance.TakeAll(ctx, s, engine.OpPeek, both[:1], nil)
		if err != nil {
			t.Fatal(err)
		}
		if before[0].Tokens != after[0].Tokens || before[0].RetryAfter != after[0].RetryAfter || before[0].ResetAfter != after[0].ResetAfter {
			t.Errorf("%d requests rolled back with no charge after them: before %+v, after %+v", len(rs), before[0], after[0])
		}
	}
}

// nodeForSlot returns the address of the primary serving slot, from
// CLUSTER NODES as seen by any node in addrs.
func nodeForSlot(addrs []string, slot uint16) string {
	for _, a := range addrs {
		if n := slotOwners(a)(slot); n != "" {
			return n
		}
	}
	return ""
}

// slotOwners reads CLUSTER NODES from addr once and returns the address
// of the live primary serving a slot ("" when addr does not answer or
// names none).
func slotOwners(addr string) func(slot uint16) string {
	out, err := redistest.CLI(addr, "CLUSTER", "NODES")
	if err != nil {
		return func(uint16) string { return "" }
	}
	type owned struct {
		lo, hi int
		addr   string
	}
	var ranges []owned
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		node, _, _ := strings.Cut(f[1], "@")
		for _, r := range f[8:] {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil {
				ranges = append(ranges, owned{l, h, node})
			}
		}
	}
	return func(slot uint16) string {
		for _, r := range ranges {
			if int(slot) >= r.lo && int(slot) <= r.hi {
				return r.addr
			}
		}
		return ""
	}
}

// keysByOwner finds request keys of lim on the Cluster addr belongs to:
// nVictim whose slots victim serves, and nOther served by the others.
func keysByOwner(t *testing.T, s *redis.Store, lim *sluice.Limit, addr, victim string, nVictim, nOther int) (onVictim, elsewhere []string) {
	t.Helper()
	owner := slotOwners(addr)
	for i := 0; len(onVictim) < nVictim || len(elsewhere) < nOther; i++ {
		if i > 10_000 {
			t.Fatalf("no keys found on every primary (%d on the victim, %d elsewhere)", len(onVictim), len(elsewhere))
		}
		k := "k" + strconv.Itoa(i)
		switch o := owner(slotOf(t, s.Client(), lim.StorageKey(k))); {
		case o == "":
			t.Fatalf("no primary serves the slot of %s", k)
		case o == victim:
			if len(onVictim) < nVictim {
				onVictim = append(onVictim, k)
			}
		case len(elsewhere) < nOther:
			elsewhere = append(elsewhere, k)
		}
	}
	return onVictim, elsewhere
}

// One primary of three dies (no replica to take over, and the others go
// on serving their slots): the store's breaker for that primary opens,
// failing its keys at once, while keys on the other two primaries see no
// store error, before or after it opened, and the store stays ready.
// Only when every primary's breaker is open is the store not ready.
func TestClusterBreakerPerNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	srvs, addrs := redistest.Primaries(t, 3)
	reg := prometheus.NewRegistry()
	// A backoff no test run outlasts: an open breaker stays open, with no
	// probe, until the test looks at it.
	s := open(t, "redis+cluster://"+strings.Join(addrs, ","), redis.Options{
		NoOverLimitCache: true, BreakerBackoff: time.Hour, Observer: observed(reg),
	})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "per-node", TokensPerSecond: 1e6, Burst: 1e6})
	victim := srvs[0]
	// More keys on the victim than elsewhere: its failures are most of the
	// calls, as many as open a breaker shared by every slot.
	dead, live := keysByOwner(t, s, lim, addrs[1], victim.Addr(), 8, 4)
	take := func(k string) error {
		_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: k})
		return err
	}
	takeLive := func(when string) {
		t.Helper()
		for _, k := range live {
			if err := take(k); err != nil {
				t.Fatalf("%s: key %s on a live primary: %v", when, k, err)
			}
		}
	}
	takeLive("before the kill")
	for _, k := range dead {
		if err := take(k); err != nil {
			t.Fatalf("before the kill: %v", err)
		}
	}

	victim.Stop()
	// Take every key until the victim's breaker has opened: its keys fail
	// (at first by their own errors, then at once), the others never do.
	opened := false
	for deadline := time.Now().Add(time.Minute); !opened; {
		if time.Now().After(deadline) {
			t.Fatal("the victim's breaker did not open within a minute")
		}
		for _, k := range dead {
			err := take(k)
			if err == nil {
				t.Fatalf("key %s on the killed primary answered", k)
			}
			if errors.Is(err, redis.ErrBreakerOpen) {
				if !strings.Contains(err.Error(), victim.Addr()) {
					t.Errorf("the refusal does not name the node %s: %v", victim.Addr(), err)
				}
				opened = true
			}
		}
		takeLive("while the victim fails")
	}
	takeLive("with the victim's breaker open")
	wantOnlyOpen(t, reg, addrs, victim.Addr())
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("not ready with two primaries of three serving: %v", err)
	}

	// The others die too: once every breaker is open, the store is not
	// ready.
	srvs[1].Stop()
	srvs[2].Stop()
	for deadline := time.Now().Add(time.Minute); ; {
		if time.Now().After(deadline) {
			t.Fatalf("breakers not all open within a minute: %v", breakerStates(t, reg))
		}
		for _, k := range live {
			take(k)
		}
		states := breakerStates(t, reg)
		if states[addrs[0]] == 1 && states[addrs[1]] == 1 && states[addrs[2]] == 1 {
			break
		}
	}
	if err := s.Ready(ctx); !errors.Is(err, redis.ErrBreakerOpen) {
		t.Fatalf("ready with every breaker open: %v", err)
	}
}

// wantOnlyOpen checks that the breaker of node, and no other of addrs, is
// open, and that no breaker without a node is exported.
func wantOnlyOpen(t *testing.T, reg *prometheus.Registry, addrs []string, node string) {
	t.Helper()
	states := breakerStates(t, reg)
	for _, a := range addrs {
		want := 0.0
		if a == node {
			want = 1
		}
		if got, ok := states[a]; !ok || got != want {
			t.Errorf("sluice_redis_breaker_state{node=%q} = %v (exported %v), want %v; all: %v", a, got, ok, want, states)
		}
	}
	if _, ok := states[""]; ok {
		t.Errorf("a breaker with no node is exported once every slot's primary is known: %v", states)
	}
}

// breakerStates reads sluice_redis_breaker_state by node.
func breakerStates(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_redis_breaker_state" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" {
					states[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return states
}

// Kill the primary of a key's slot under load: calls fail (for the caller
// to apply on_store_error) until the replica takes over, then answers
// resume without a restart, and count correctly.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("failover takes seconds")
	}
	url := clusterURL(t)
	shared.mu.Lock()
	srvs := shared.clusterSrvs
	shared.mu.Unlock()
	if srvs == nil {
		t.Skip("failover needs the test's own cluster, not SLUICE_REDIS_CLUSTER_URL")
	}
	s := open(t, url, redis.Options{Timeout: 200 * time.Millisecond, NoOverLimitCache: true, BreakerBackoff: 50 * time.Millisecond})
	lim := uniqueLimit(t, sluice.Spec{Name: "failover", TokensPerSecond: 1e6, Burst: 1e6})
	key := lim.StorageKey("k")
	var addrs []string
	for _, sv := range srvs {
		addrs = append(addrs, sv.Addr())
	}
	primary := nodeForSlot(addrs, slotOf(t, s.Client(), key))
	var victim *redistest.Proc
	for _, sv := range srvs {
		if sv.Addr() == primary {
			victim = sv
		}
	}
	if victim == nil {
		t.Fatalf("no primary found for %s", key)
	}
	takeThroughFailover(t, s, lim, victim, addrs)
	checkCountingAfterFailover(t, url)

	// Bring the old primary back as a replica, for the tests that follow.
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	if err := redistest.WaitClusterOK(addrs, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// A Cluster whose primaries change over and over (here each shard failed
// over to its replica and back, as repeated failovers or resharding do)
// keeps batch writers for the primaries it has, not for every primary it
// has seen: each primary that comes back is a new node with writers of
// its own, and a gone one's writers exited only at Close, so a
// long-running process grew by a batcher per change. Once the calls the
// old table sent them are done, a gone primary's writers exit; the takes
// running throughout all return.
func TestClusterTopologyChurnRetiresBatchers(t *testing.T) {
	if testing.Short() {
		t.Skip("failovers take seconds")
	}
	url := clusterURL(t)
	shared.mu.Lock()
	srvs := shared.clusterSrvs
	shared.mu.Unlock()
	if srvs == nil {
		t.Skip("failovers need the test's own cluster, not SLUICE_REDIS_CLUSTER_URL")
	}
	var addrs []string
	for _, sv := range srvs {
		addrs = append(addrs, sv.Addr())
	}
	s := open(t, url, redis.Options{Timeout: 100 * time.Millisecond, NoOverLimitCache: true, BreakerBackoff: 50 * time.Millisecond})
	lim := uniqueLimit(t, sluice.Spec{Name: "churn", TokensPerSecond: 1e6, Burst: 1e6})
	// A key on each primary, and its slot.
	owner := slotOwners(addrs[0])
	var keys []string
	var slots []uint16
	seen := map[string]bool{}
	for i := 0; len(keys) < 3; i++ {
		if i > 10_000 {
			t.Fatalf("no key found on every primary (%d found)", len(keys))
		}
		k := "k" + strconv.Itoa(i)
		slot := slotOf(t, s.Client(), lim.StorageKey(k))
		if o := owner(slot); o != "" && !seen[o] {
			seen[o] = true
			keys, slots = append(keys, k), append(slots, slot)
		}
	}
	if err := redis.RefreshSlots(s); err != nil {
		t.Fatal(err)
	}
	base := redis.Batchers(s) // the fallback's and the primaries'

	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var answered, failed atomic.Int64
	for range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: keys[i%len(keys)]})
				if err == nil {
					answered.Add(1)
				} else {
					if sluice.IsInputError(err) {
						t.Errorf("store failure reported as input error: %v", err)
					}
					failed.Add(1)
				}
				time.Sleep(time.Millisecond) // pacing the takes on a small machine, not waiting for tokens
			}
		})
	}

	// Each shard over to its replica, then back, which leaves the Cluster
	// as it was for the tests that follow. No node wins two elections
	// here: one that won within twice the node timeout can read a new
	// request as that election, already won, and stay a replica (it is
	// asked again then, while its primary holds writes for the failover).
	failovers := 0
	for range 2 {
		for _, slot := range slots {
			primary := nodeForSlot(addrs, slot)
			replica := waitReplicaOf(t, primary)
			for deadline, asked := time.Now().Add(time.Minute), (time.Time{}); !slotServedBy(addrs, slot, replica); {
				if time.Now().After(deadline) {
					out, _ := redistest.CLI(replica, "CLUSTER", "NODES")
					t.Fatalf("the nodes do not all name %s the primary of slot %d after its failover; its CLUSTER NODES:\n%s", replica, slot, out)
				}
				if time.Since(asked) > 6*time.Second {
					if out, err := redistest.CLI(replica, "CLUSTER", "FAILOVER"); err != nil || !strings.Contains(out, "OK") {
						t.Fatalf("CLUSTER FAILOVER on %s: %q, %v", replica, out, err)
					}
					asked = time.Now()
				}
				time.Sleep(50 * time.Millisecond) // waiting for the cluster, not for tokens
			}
			failovers++
			if err := redistest.WaitClusterOK(addrs, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			// What a failed call does, at most once per backoff: a manual
			// failover fails none (rueidis follows the MOVED).
			if err := redis.RefreshSlots(s); err != nil {
				t.Fatal(err)
			}
		}
	}

	for deadline := time.Now().Add(30 * time.Second); redis.Batchers(s) > base; {
		if time.Now().After(deadline) {
			t.Fatalf("%d batchers after %d failovers, want %d (the fallback's and one per primary): a gone primary's writers run until Close", redis.Batchers(s), failovers, base)
		}
		time.Sleep(10 * time.Millisecond) // waiting for the retirement, not for tokens
	}
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute): // only ends a build that would hang
		t.Fatal("takes still wait after the failovers")
	}
	for _, k := range keys {
		if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: k}); err != nil {
			t.Fatalf("take of %s after the failovers: %v", k, err)
		}
	}
	t.Logf("%d failovers: %d takes answered, %d failed", failovers, answered.Load(), failed.Load())
}

// waitReplicaOf waits until the primary at addr has a replica, and
// returns its address: after a failover, the old primary serves no slot
// for a moment before it follows the new one.
func waitReplicaOf(t *testing.T, addr string) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if r := replicaOf(addr); r != "" {
			return r
		}
		if time.Now().After(deadline) {
			out, _ := redistest.CLI(addr, "CLUSTER", "NODES")
			t.Fatalf("no replica of %s:\n%s", addr, out)
		}
		time.Sleep(50 * time.Millisecond) // waiting for the cluster, not for tokens
	}
}

// replicaOf is the address of a replica of the primary at addr, from its
// CLUSTER NODES ("" when it names none).
func replicaOf(addr string) string {
	out, err := redistest.CLI(addr, "CLUSTER", "NODES")
	if err != nil {
		return ""
	}
	var self string
	lines := strings.Split(out, "\n")
	for _, line := range lines {
		if f := strings.Fields(line); len(f) > 2 && strings.Contains(f[2], "myself") {
			self = f[0]
		}
	}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) > 3 && strings.Contains(f[2], "slave") && !strings.Contains(f[2], "fail") && f[3] == self {
			node, _, _ := strings.Cut(f[1], "@")
			return node
		}
	}
	return ""
}

// slotServedBy reports whether every node of addrs names primary the
// primary of slot.
func slotServedBy(addrs []string, slot uint16, primary string) bool {
	for _, a := range addrs {
		if slotOwners(a)(slot) != primary {
			return false
		}
	}
	return true
}

// takeThroughFailover takes from lim's key "k" in 8 goroutines while
// victim, the primary of the key's slot, is killed, and fails unless the
// takes are answered again within a minute.
func takeThroughFailover(t *testing.T, s *redis.Store, lim *sluice.Limit, victim *redistest.Proc, addrs []string) {
	ctx := context.Background()
	key := lim.StorageKey("k")
	primary := victim.Addr()
	var ok, failed atomic.Int64
	var mu sync.Mutex
	var lastFail, firstFail time.Time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
				if err != nil {
					if sluice.IsInputError(err) {
						t.Errorf("store failure reported as input error: %v", err)
					}
					failed.Add(1)
					mu.Lock()
					if firstFail.IsZero() {
						firstFail = time.Now()
					}
					lastFail = time.Now()
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	killed := time.Now()
	victim.Stop()
	deadline := time.Now().Add(time.Minute)
	recovered := false
	for time.Now().Before(deadline) {
		before := ok.Load()
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		quiet := !lastFail.IsZero() && time.Since(lastFail) > 300*time.Millisecond
		mu.Unlock()
		if quiet && ok.Load() > before {
			recovered = true
			break
		}
	}
	close(stop)
	wg.Wait()
	if !recovered {
		_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		t.Logf("last error: %v; slot now served by %s", err, nodeForSlot(addrs, slotOf(t, s.Client(), key)))
		for _, a := range addrs {
			out, err := redistest.CLI(a, "CLUSTER", "NODES")
			if err == nil && !strings.Contains(out, "Could not") {
				t.Logf("%s:\n%s", a, out)
				break
			}
		}
		t.Fatalf("no recovery within a minute of killing %s (ok %d, failed %d)", primary, ok.Load(), failed.Load())
	}
	mu.Lock()
	t.Logf("killed primary %s: first failure %v after the kill, last failure %v after; gap of failed answers %v; %d failed, %d answered",
		primary, firstFail.Sub(killed), lastFail.Sub(killed), lastFail.Sub(firstFail), failed.Load(), ok.Load())
	mu.Unlock()

}

// checkCountingAfterFailover: counting is exact on the promoted replica.
func checkCountingAfterFailover(t *testing.T, url string) {
	ctx := context.Background()
	clock := sluice.NewManualClock(time.UnixMicro(6_000_000_000_000))
	s2 := open(t, url, redis.Options{Clock: clock, NoOverLimitCache: true})
	exact := uniqueLimit(t, sluice.Spec{Name: "after-failover", TokensPerSecond: 1, Burst: 5})
	admitted := 0
	for range 8 {
		d, err := conformance.Take(ctx, s2, engine.OpTake, sluice.Request{Limit: exact, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d of burst 5 after failover", admitted)
	}
}

// Batching: many goroutines on a few keys, on one Redis and on a Cluster
// (one script call per slot). Script calls carry several requests, and the
// answers are exact: each key admits its burst and not one more.
func TestBatchingExact(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(testing.TB) string
	}{{"standalone", standaloneURL}, {"cluster", clusterURL}} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			clock := sluice.NewManualClock(time.UnixMicro(9_000_000_000_000))
			s := open(t, tc.url(t), redis.Options{Clock: clock, NoOverLimitCache: true, Observer: observed(reg)})
			lim := uniqueLimit(t, sluice.Spec{Name: "batch", TokensPerSecond: 1, Burst: 50})
			keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
			ctx := context.Background()
			var admitted [8]atomic.Int64
			var wg sync.WaitGroup
			for w := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 20 {
						k := (w + i) % len(keys)
						d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: keys[k]})
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							admitted[k].Add(1)
						}
					}
				}()
			}
			wg.Wait()
			for k := range keys {
				if n := admitted[k].Load(); n != 50 {
					t.Errorf("key %s admitted %d of 160 asks, want exactly the burst 50", keys[k], n)
				}
			}
			count, sum := histogram(t, reg, "sluice_redis_batch_requests")
			t.Logf("%d script calls carried %d requests", count, sum)
			if sum != 64*20 || count >= sum {
				t.Fatalf("%d script calls for %d requests: no batching", count, sum)
			}
		})
	}
}

// TestRunsAnswerAsLoneGroups: a run of lone requests sharing their
// arguments ("T3", what the batch writer sends for calls one after
// another with the same limit and cost) is answered exactly as the same
// requests each in a group of its own: takes, peeks and refunds of
// buckets, fixed and sliding windows and sliding logs, with keys repeated
// within a run, against two copies of the same keys in one script call.
func TestRunsAnswerAsLoneGroups(t *testing.T) {
	s := open(t, standaloneURL(t), redis.Options{})
	ctx := context.Background()
	zero := time.Duration(0)
	limits := []*sluice.Limit{
		uniqueLimit(t, sluice.Spec{Name: "tb", TokensPerSecond: 2, Burst: 4}),
		uniqueLimit(t, sluice.Spec{Name: "fw", Algorithm: sluice.FixedWindow, Rate: 3, Period: time.Second, Start: &zero}),
		uniqueLimit(t, sluice.Spec{Name: "sw", Algorithm: sluice.SlidingWindow, Rate: 3, Period: time.Second}),
		uniqueLimit(t, sluice.Spec{Name: "sl", Algorithm: sluice.SlidingLog, Rate: 3, Period: time.Second}),
	}
	ops := []engine.Op{engine.OpTake, engine.OpTake, engine.OpPeek, engine.OpRefund}
	rng := rand.New(rand.NewPCG(1, 2))
	now := int64(1_800_000_000_000_000)
	for round := range 20 {
		var plain, copies [][]string
		var keys, copyKeys []string
		li, op, cost := 0, engine.OpTake, 1.0
		for range 60 {
			if rng.IntN(4) == 0 { // mostly the request before's limit, op and cost
				li, op, cost = rng.IntN(len(limits)), ops[rng.IntN(len(ops))], float64(1+rng.IntN(2))
			}
			key := "k" + strconv.Itoa(rng.IntN(3))
			c, err := sluice.Request{Limit: limits[li], Key: key, Cost: cost}.Charged(op)
			if err != nil {
				t.Fatal(err)
			}
			g := redis.LoneGroup(op, c, now)
			plain, copies = append(plain, g), append(copies, g)
			keys = append(keys, limits[li].StorageKey("a"+key))
			copyKeys = append(copyKeys, limits[li].StorageKey("b"+key))
		}
		var lone []string
		for _, g := range plain {
			lone = append(lone, g...)
		}
		runs := redis.JoinRuns(copies)
		if len(runs) >= len(lone) {
			t.Fatalf("round %d: no run among %d requests", round, len(plain))
		}
		got, err := redis.Script(ctx, s, append(keys, copyKeys...), append(lone, runs...))
		if err != nil {
			t.Fatal(err)
		}
		if half := len(got) / 2; !slices.Equal(got[:half], got[half:]) {
			t.Fatalf("round %d: lone groups answered\n%v\nthe runs\n%v", round, got[:half], got[half:])
		}
		now += int64(rng.IntN(400_000))
	}
}

func histogram(t *testing.T, reg *prometheus.Registry, name string) (count, sum uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), uint64(h.GetSampleSum())
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0, 0
}

// A hot limit sharded three ways on a cluster of three primaries is kept
// on all three: each shard's key in its own slot, on its own primary,
// whatever hash tag the request key holds; and traffic through a Limiter
// reaches every one.
func TestClusterShardsSpreadOverNodes(t *testing.T) {
	url := clusterURL(t)
	clock := sluice.NewManualClock(time.UnixMicro(9_000_000_000_000))
	s := open(t, url, redis.Options{Clock: clock})
	c := s.Client()
	addrs := strings.Split(strings.TrimPrefix(url, "redis+cluster://"), ",")
	lim := uniqueLimit(t, sluice.Spec{Name: "hot", TokensPerSecond: 1000, Burst: 300, Shards: 3})
	for _, key := range []string{"*", "{user-42}"} {
		nodes := map[string]bool{}
		for i := range lim.Shards() {
			slot := slotOf(t, c, lim.StorageKey(lim.ShardKey(key, i)))
			node := nodeForSlot(addrs, slot)
			if node == "" {
				t.Fatalf("no primary serves slot %d", slot)
			}
			nodes[node] = true
		}
		if len(nodes) != 3 {
			t.Fatalf("key %q: the 3 shards are on %d primaries, want 3", key, len(nodes))
		}
	}
	ctx := context.Background()
	l := sluice.New(s)
	for range 60 {
		if d, err := l.Take(ctx, sluice.Request{Limit: lim, Key: "*", Cost: 2}); err != nil || !d.Allowed {
			t.Fatalf("take: %v %+v", err, d)
		}
	}
	for i := range lim.Shards() {
		k := lim.StorageKey(lim.ShardKey("*", i))
		if err := c.Do(ctx, c.B().Get().Key(k).Build()).Error(); err != nil {
			t.Fatalf("shard %d (%s) was never charged: %v", i, k, err)
		}
	}
	d, err := l.Peek(ctx, sluice.Request{Limit: lim, Key: "*", Cost: 1})
	if err != nil || !d.Allowed || d.Tokens != 300-120-1 {
		t.Fatalf("peek after 120 tokens taken: %v %+v", err, d)
	}
}

// sentCounter counts the requests the batch writers sent (Observer.Batch),
// the rest of what it is told going to the Observer it embeds.
type sentCounter struct {
	redis.Observer
	sent atomic.Int64
}

func (o *sentCounter) Batch(n int) { o.sent.Add(int64(n)) }

// A Cluster primary that hangs (SIGSTOP, a lost network) must fail only
// its own slots, as a killed one does (TestClusterBreakerPerNode): calls
// to it hold the batch writers' places in flight (and share pipelined
// rounds with other slots' calls) until the store's deadline, so keys on
// the primaries that answer wait behind them. Clients of the hung
// primary's slots (or any caller whose key lands there) stall every
// other client of the store until their calls time out.
func TestAttackHungPrimaryStallsOtherPrimaries(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	srvs, addrs := redistest.Primaries(t, 3)
	obs := &sentCounter{Observer: metrics.NewRedisObserver()}
	// A deadline long enough that "answered before the hung calls' deadline"
	// says nothing of this machine's speed.
	s := open(t, withQuery("redis+cluster://"+strings.Join(addrs, ","), slowClientTimeouts), redis.Options{
		NoOverLimitCache: true, Timeout: 5 * time.Second, BreakerBackoff: time.Hour, Observer: obs, BatchWriters: 2,
	})
	lim := uniqueLimit(t, sluice.Spec{Name: "hung-node", TokensPerSecond: 1e6, Burst: 1e6})
	victim := srvs[0]
	dead, lives := keysByOwner(t, s, lim, addrs[1], victim.Addr(), 8, 1)
	live := lives[0]
	ctx := context.Background()
	take := func(k string) error {
		_, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: k})
		return err
	}
	for _, k := range append([]string{live}, dead...) {
		if err := take(k); err != nil {
			t.Fatalf("before the hang: %v", err)
		}
	}
	before := obs.sent.Load()

	if err := victim.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.Signal(syscall.SIGCONT) })
	var returned atomic.Int64 // calls to the hung primary that came back
	for _, k := range dead {
		go func() {
			take(k)
			returned.Add(1)
		}()
	}
	// Wait until two of them are in flight to the hung primary: as many
	// as a batcher has places (BatchWriters).
	for deadline := time.Now().Add(10 * time.Second); obs.sent.Load()-before < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d calls to the hung primary were sent", obs.sent.Load()-before, len(dead))
		}
		time.Sleep(time.Millisecond) // polling for the sends, not for tokens
	}
	if err := take(live); err != nil {
		t.Fatalf("key %s on a live primary failed while another primary hangs: %v", live, err)
	}
	if n := returned.Load(); n > 0 {
		t.Fatalf("a take on a live primary waited for the hung primary: it returned only after %d of %d calls to the hung one had run out their deadline", n, len(dead))
	}
}

// TestAttackFailedRollbackAdmitsRejected: a Cluster TakeAll that a later
// slot rejects refunds the slots it charged first. When that refund
// failed (their primary hung or went away after the charge), the call
// returned an error, and on_store_error (allow, by default) admitted the
// request a limit had just rejected. The rejection stands; the charge
// left in place is capacity lost until the bucket refills.
func TestAttackFailedRollbackAdmitsRejected(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	srvs, addrs := redistest.Primaries(t, 3)
	s := open(t, withQuery("redis+cluster://"+strings.Join(addrs, ","), slowClientTimeouts), redis.Options{
		NoOverLimitCache: true, Timeout: time.Second, BreakerBackoff: time.Hour,
	})
	c := s.Client()
	ctx := context.Background()
	first := uniqueLimit(t, sluice.Spec{Name: "first", TokensPerSecond: 1, Burst: 10})
	gate := uniqueLimit(t, sluice.Spec{Name: "gate", TokensPerSecond: 1, Burst: 1})
	owner := slotOwners(addrs[1])
	// first's key in a low slot, the gate's in a high one on another
	// primary: the TakeAll charges first, then the gate rejects.
	key, gateKey := "", ""
	for i := 0; key == "" || gateKey == ""; i++ {
		k := "k" + strconv.Itoa(i)
		if key == "" && slotOf(t, c, first.StorageKey(k)) < 4000 {
			key = k
		} else if key != "" && slotOf(t, c, gate.StorageKey(k)) > 12000 && owner(slotOf(t, c, gate.StorageKey(k))) != owner(slotOf(t, c, first.StorageKey(key))) {
			gateKey = k
		}
	}
	var victim *redistest.Proc
	for _, p := range srvs {
		if p.Addr() == owner(slotOf(t, c, first.StorageKey(key))) {
			victim = p
		}
	}
	if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: gate, Key: gateKey}); err != nil {
		t.Fatal(err) // the gate is empty
	}
	redis.SetBeforeRollback(s, func() {
		if err := victim.Signal(syscall.SIGSTOP); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { victim.Signal(syscall.SIGCONT) })
	ds, err := conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{{Limit: first, Key: key}, {Limit: gate, Key: gateKey}}, nil)
	if err != nil || sluice.Combine(ds).Allowed {
		t.Fatalf("TakeAll past an empty gate whose refund failed: %+v, %v; want rejected, without an error on_store_error would answer", ds, err)
	}
}

// TestAttackClusterRollbackRefundsLaterWindow: a Cluster TakeAll that a
// later slot rejects refunds the slots it charged first, a round trip or
// two after the charge. A refund counts in the window of its moment, so
// a charge made in a window's last instant and refunded in the next gave
// that next window its cost again: a client whose own limit (in a higher
// slot) refuses it could send requests just before a boundary and have
// the shared window admit up to twice its capacity after it (a sliding
// window half as much again). The rollback now tells the refund the
// window its take counted in, and a window that has ended keeps the
// charge (capacity lost, never admitted twice).
func TestAttackClusterRollbackRefundsLaterWindow(t *testing.T) {
	boundary := time.Date(2031, 3, 14, 0, 0, 0, 0, time.UTC) // a midnight: every window below starts there
	zero := time.Duration(0)
	for _, tc := range []struct {
		name    string
		spec    sluice.Spec
		period  time.Duration
		phantom float64 // charged just before the boundary, then rolled back
	}{
		{"fixed_window", sluice.Spec{Name: "rb-fw", Algorithm: sluice.FixedWindow, Rate: 10, Period: time.Second, Start: &zero}, time.Second, 10},
		{"calendar_day", sluice.Spec{Name: "rb-cw", Algorithm: sluice.FixedWindow, Rate: 10, Calendar: sluice.CalendarDay}, 24 * time.Hour, 10},
		{"sliding_window", sluice.Spec{Name: "rb-sw", Algorithm: sluice.SlidingWindow, Rate: 10, Period: time.Second}, time.Second, 5},
		{"calendar_sliding", sluice.Spec{Name: "rb-csw", Algorithm: sluice.SlidingWindow, Rate: 10, Calendar: sluice.CalendarDay, Timezone: "UTC"}, 24 * time.Hour, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := sluice.NewManualClock(boundary.Add(-time.Millisecond))
			s := open(t, clusterURL(t), redis.Options{Clock: clock, NoOverLimitCache: true})
			c := s.Client()
			ctx := context.Background()
			shared := uniqueLimit(t, tc.spec)
			gate := uniqueLimit(t, sluice.Spec{Name: "gate", TokensPerSecond: 0.001, Burst: 1})
			key, gateKey := "", ""
			for i := 0; key == "" || gateKey == ""; i++ {
				k := "k" + strconv.Itoa(i)
				switch {
				case key == "" && slotOf(t, c, shared.StorageKey(k)) < 4000:
					key = k
				case key != "" && slotOf(t, c, gate.StorageKey(k)) > 12000:
					gateKey = k
				}
			}
			// drain takes one token at a time until the window refuses.
			drain := func() int {
				t.Helper()
				n := 0
				for ; n < 100; n++ {
					d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: shared, Key: key})
					if err != nil {
						t.Fatal(err)
					}
					if !d.Allowed {
						break
					}
				}
				return n
			}
			if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: gate, Key: gateKey}); err != nil {
				t.Fatal(err) // the client's own limit is empty
			}
			admitted := 0
			redis.SetBeforeRollback(s, func() {
				clock.Set(boundary.Add(time.Millisecond))
				admitted += drain() // the next window, before the refund lands
			})
			ds, err := conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{{Limit: shared, Key: key, Cost: tc.phantom}, {Limit: gate, Key: gateKey}}, nil)
			if err != nil || sluice.Combine(ds).Allowed {
				t.Fatalf("TakeAll past an empty gate: %+v, %v; want rejected", ds, err)
			}
			redis.SetBeforeRollback(s, nil)
			admitted += drain()
			clock.Set(boundary.Add(tc.period - time.Millisecond))
			admitted += drain()
			if capacity := int(shared.Capacity()); admitted > capacity {
				t.Errorf("the window after the boundary admitted %d, above its capacity %d: a charge of the window before was refunded into it", admitted, capacity)
			}
		})
	}
}
