package sluice

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/engine"
)

// crc16 is Redis Cluster's key hash: its check value, and the slots
// Redis's documentation gives for two keys.
func TestCRC16(t *testing.T) {
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	for key, slot := range map[string]uint16{"foo": 12182, "bar": 5061} {
		if got := crc16(key) % clusterSlots; got != slot {
			t.Errorf("slot of %q = %d, want %d", key, got, slot)
		}
	}
}

// Every slot has a tag, and the tag hashes to it.
func TestSlotTags(t *testing.T) {
	tags := slotTags()
	for slot, n := range tags {
		if got := crc16(strconv.FormatUint(uint64(n), 10)) % clusterSlots; int(got) != slot {
			t.Fatalf("tag %d of slot %d hashes to slot %d", n, slot, got)
		}
	}
}

// The shards of a limit fall in distinct slots spread evenly over the
// slot range, so on a Cluster whose nodes hold even ranges they fall on
// as many nodes as there are (up to the shard count).
func TestShardTagsSpread(t *testing.T) {
	for _, n := range []int{2, 3, 4, 10, 64, MaxShards} {
		tags := shardTags("global-rps", n)
		var slots []int
		for _, tag := range tags {
			slots = append(slots, int(crc16(tag[1:len(tag)-1])%clusterSlots))
		}
		base := slots[0]
		for i, s := range slots {
			if want := (base + i*clusterSlots/n) % clusterSlots; s != want {
				t.Fatalf("n=%d: shard %d in slot %d, want %d", n, i, s, want)
			}
		}
		// Three primaries with even ranges, as redis-cli --cluster create makes them.
		nodes := map[int]bool{}
		for _, s := range slots {
			nodes[s*3/clusterSlots] = true
		}
		if want := min(n, 3); len(nodes) != want {
			t.Errorf("n=%d: shards on %d of 3 even nodes, want %d", n, len(nodes), want)
		}
	}
}

// A shard's share is rounded down, so the shards together never allow
// more than the limit; a rate that divides exactly stays exact.
func TestShardParams(t *testing.T) {
	l := MustLimit(Spec{Name: "x", Rate: 7, Period: 3 * time.Second, Capacity: 10, MaxReserved: 5, Shards: 3})
	p, s := l.params, l.shards.lim.params
	if s.Capacity*3 > p.Capacity || s.Capacity != 3_333_333 || s.MaxReserved != 1_666_666 {
		t.Fatalf("shard capacity %d, max_reserved %d", s.Capacity, s.MaxReserved)
	}
	if s.RateNum*p.RateDen*3 != p.RateNum*s.RateDen {
		t.Fatalf("shard rate %d/%d is not a third of %d/%d", s.RateNum, s.RateDen, p.RateNum, p.RateDen)
	}
	// 1e9-1 per second has no exact third within the engines' precision:
	// rounded down.
	l = MustLimit(Spec{Name: "y", Rate: 999_999_999e-6, Period: time.Second, Capacity: 10, Shards: 7})
	p, s = l.params, l.shards.lim.params
	if s.RateDen > engine.MaxRateDen || float64(s.RateNum)/float64(s.RateDen)*7 > float64(p.RateNum)/float64(p.RateDen) {
		t.Fatalf("shard rate %d/%d times 7 exceeds %d/%d", s.RateNum, s.RateDen, p.RateNum, p.RateDen)
	}
	fw := MustLimit(Spec{Name: "z", Algorithm: FixedWindow, Rate: 10, Period: time.Second, Capacity: 25, Shards: 4})
	if s := fw.shards.lim.params; s.WindowRate != 2_500_000 || s.Capacity != 6_250_000 {
		t.Fatalf("fixed window shard: rate %d, capacity %d", s.WindowRate, s.Capacity)
	}
}

func TestShardSpecErrors(t *testing.T) {
	for _, c := range []struct {
		spec Spec
		want string
	}{
		{Spec{Name: "a", TokensPerSecond: 10, Burst: 10, Shards: -1}, "shards must be >= 1"},
		{Spec{Name: "a", TokensPerSecond: 10, Burst: 10, Shards: MaxShards + 1}, "at most 256"},
		{Spec{Name: "a", Algorithm: LeakyBucket, Rate: 10, Shards: 2}, "leaky bucket"},
		{Spec{Name: "a{b}", TokensPerSecond: 10, Burst: 10, Shards: 2}, "name must be"}, // a '{' would also split the shard keys' hash tags
		{Spec{Name: "a", TokensPerSecond: 10, Burst: 0.000003, Shards: 4}, "below one micro-token"},
	} {
		_, err := NewLimit(c.spec)
		if !errors.Is(err, ErrInvalidLimit) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an invalid limit saying %q", c.spec, err, c.want)
		}
	}
	for _, n := range []int{0, 1} {
		l := MustLimit(Spec{Name: "a", TokensPerSecond: 10, Burst: 10, Shards: n})
		if l.shards != nil || l.Shards() != 1 || l.ShardKey("k", 0) != "k" || l.MaxCost() != 10 {
			t.Errorf("shards %d: a sharded limit, want one bucket", n)
		}
	}
}

// The cost rule of a sharded limit: up to what two shards hold without a
// reservation; with one, also up to what one shard may reserve.
func TestShardedCharge(t *testing.T) {
	l := MustLimit(Spec{Name: "x", TokensPerSecond: 10, Burst: 100, MaxReserved: 60, Shards: 10})
	for _, c := range []struct {
		cost    float64
		reserve bool
		op      engine.Op
		want    error
	}{
		{20, false, engine.OpTake, nil},
		{20.000001, false, engine.OpTake, ErrCostExceedsLimit},
		{20.000001, false, engine.OpPeek, ErrCostExceedsLimit},
		{100, false, engine.OpTake, ErrCostExceedsLimit},
		{10, true, engine.OpTake, nil},
		{20, true, engine.OpTake, nil}, // beyond one shard's credit, within two shards' tokens
		{21, true, engine.OpTake, ErrCostExceedsLimit},
		{1000, false, engine.OpRefund, nil}, // a refund is clamped, never an error
		{-1, false, engine.OpTake, ErrInvalidCost},
	} {
		_, err := Request{Limit: l, Key: "k", Cost: c.cost, Reserve: c.reserve}.Charged(c.op)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("cost %v reserve %v %s: got %v, want %v", c.cost, c.reserve, c.op, err, c.want)
		}
	}
	if got := l.MaxCost(); got != 20 {
		t.Fatalf("MaxCost %v, want 20", got)
	}
	// Fixed windows reserve, sharded or not; sliding logs never do.
	fw := MustLimit(Spec{Name: "w", Algorithm: FixedWindow, Rate: 10, Period: time.Second, Shards: 2})
	if _, err := (Request{Limit: fw, Key: "k", Cost: 1, Reserve: true}).Charged(engine.OpTake); err != nil {
		t.Fatalf("reserving on a sharded fixed window: %v", err)
	}
	sl := MustLimit(Spec{Name: "s", Algorithm: SlidingLog, Rate: 10, Period: time.Second, Shards: 2})
	if _, err := (Request{Limit: sl, Key: "k", Cost: 1, Reserve: true}).Charged(engine.OpTake); !errors.Is(err, ErrReserveUnsupported) {
		t.Fatalf("reserving on a sharded sliding log: %v, want ErrReserveUnsupported", err)
	}
}

func parts(ps ...shardPart) []shardPart { return ps }

func TestPlanTake(t *testing.T) {
	const m = engine.TokenScale
	for _, c := range []struct {
		name         string
		cost, ta, tb int64
		reservable   bool
		want         []shardPart
		admit        bool
	}{
		{"the fuller alone", 3 * m, 2 * m, 5 * m, false, parts(shardPart{shard: 1, cost: 3 * m}), true},
		{"split even", 6 * m, 5 * m, 2 * m, false, parts(shardPart{0, 4_500_000, false}, shardPart{1, 1_500_000, false}), true},
		{"split to zero", 10 * m, 5 * m, 5 * m, false, parts(shardPart{0, 5 * m, false}, shardPart{1, 5 * m, false}), true},
		{"reserve from the fuller", 3 * m, 1 * m, 0, true, parts(shardPart{0, 3 * m, true}), false},
		{"short: equal deficits", 4 * m, 1 * m, 2 * m, false, parts(shardPart{1, 2_500_000, false}, shardPart{0, 1_500_000, false}), false},
		{"short, one in debt: parts within a shard", 8 * m, 1 * m, -6 * m, false, parts(shardPart{0, 5 * m, false}, shardPart{1, 3 * m, false}), false},
		{"short, small cost, one in debt", 1 * m, 0, -6 * m, false, parts(shardPart{0, 1 * m, false}), false},
	} {
		got, admit := planTake(c.cost, 5*m, 0, 1, c.ta, c.tb, c.reservable)
		if !slices.Equal(got, c.want) || admit != c.admit {
			t.Errorf("%s: got %+v %v, want %+v %v", c.name, got, admit, c.want, c.admit)
		}
		var sum int64
		for _, p := range got {
			sum += p.cost
			if p.cost <= 0 || p.cost > 5*m {
				t.Errorf("%s: part %+v outside (0, capacity]", c.name, p)
			}
		}
		if sum != c.cost {
			t.Errorf("%s: parts sum to %d, want %d", c.name, sum, c.cost)
		}
	}
}

func TestPlanRefund(t *testing.T) {
	const m = engine.TokenScale
	got := planRefund(4*m, 5*m, []int{3, 7}, []int64{4 * m, 1 * m})
	if want := parts(shardPart{7, 4 * m, false}); !slices.Equal(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	got = planRefund(7*m, 5*m, []int{3, 7}, []int64{4 * m, 1 * m})
	if want := parts(shardPart{7, 4 * m, false}, shardPart{3, 1 * m, false}); !slices.Equal(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if got := planRefund(m, 5*m, []int{0, 1}, []int64{5 * m, 5 * m}); len(got) != 0 {
		t.Fatalf("refund to full shards: %+v, want nothing", got)
	}
	if got := planRefund(9*m, 5*m, []int{0, 1}, []int64{5 * m, -20 * m}); !slices.Equal(got, parts(shardPart{1, 5 * m, false})) {
		t.Fatalf("refund to a shard deep in debt: %+v, want at most a capacity", got)
	}
}

func TestFullestTwo(t *testing.T) {
	for _, c := range []struct {
		ts   []int64
		a, b int
	}{
		{[]int64{1, 2}, 1, 0},
		{[]int64{3, 3, 3}, 0, 1},
		{[]int64{0, 5, 2, 7, 7}, 3, 4},
		{[]int64{9, 1, 8}, 0, 2},
	} {
		if a, b := fullestTwo(c.ts); a != c.a || b != c.b {
			t.Errorf("%v: got %d %d, want %d %d", c.ts, a, b, c.a, c.b)
		}
	}
}

// clusterSlot is the Redis Cluster slot of a key: the CRC16 of its hash
// tag (what lies between its first '{' and the first '}' after it, when
// not empty), else of the whole key.
func clusterSlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) % clusterSlots
}

// Attack: a client chooses its key (the decision API passes it as sent;
// a library caller may put a hash tag in it) so as to name another key's
// shard, or to pin all of a hot limit's shards to one Cluster slot with a
// hash tag of its own. Every (key, shard) pair must be a bucket of its
// own, and every key's shards must fall in as many slots as there are
// shards, whatever the key holds.
func TestAttackKeyNamesAShard(t *testing.T) {
	lim := MustLimit(Spec{Name: "hot", TokensPerSecond: 100, Burst: 100, Shards: 4})
	keys := []string{"alice", "", "*", "{alice}", "{}", "}{", "{x}{y}", "a{b}c", "{0}", "{", "}"}
	for i := range lim.Shards() {
		keys = append(keys, lim.ShardKey("alice", i), lim.ShardKey("alice", i)[:3], "alice"+lim.ShardKey("", i))
	}
	owner := map[string]string{}
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			continue
		}
		seen[k] = true
		slots := map[uint16]bool{}
		for i := range lim.Shards() {
			sk := "sluice:" + lim.StorageKey(lim.ShardKey(k, i))
			if prev, ok := owner[sk]; ok {
				t.Fatalf("shard %d of key %q is %q, already the bucket of %s", i, k, sk, prev)
			}
			owner[sk] = "shard of " + k
			slots[clusterSlot(sk)] = true
		}
		if len(slots) != lim.Shards() {
			t.Errorf("the %d shards of key %q fall in %d slots", lim.Shards(), k, len(slots))
		}
	}
}

// takeCounter counts, per call, the keys a store is asked to charge.
type takeCounter struct {
	mu      sync.Mutex
	charged map[string]bool
	peeked  int
}

func (c *takeCounter) note(op engine.Op, rs []Charged) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range rs {
		if op == engine.OpTake {
			c.charged[r.Limit.StorageKey(r.Key)] = true
		} else {
			c.peeked++
		}
	}
}

func (c *takeCounter) Take(ctx context.Context, op engine.Op, r Charged) (Decision, error) {
	ds, err := c.TakeAll(ctx, op, []Charged{r}, nil)
	if err != nil {
		return Decision{}, err
	}
	return ds[0], nil
}

func (c *takeCounter) Supports(*Limit) error { return nil }

func (c *takeCounter) TakeAll(_ context.Context, op engine.Op, rs []Charged, _ []Decision) ([]Decision, error) {
	c.note(op, rs)
	ds := make([]Decision, len(rs))
	for i, r := range rs {
		ds[i] = r.Limit.Decide(engine.Outcome{Allowed: true, Tokens: r.Limit.params.Capacity})
	}
	return ds, nil
}

func (c *takeCounter) Reset(context.Context, *Limit, string) error { return nil }

func (c *takeCounter) Lease(context.Context, engine.Op, Request, engine.LeaseID) (Decision, error) {
	return Decision{}, ErrLeaseRequired
}

// Attack: a client sends one request per fresh key to a per-key sharded
// limit. Sharding must not multiply the keys each request writes by the
// shard count: a take charges at most two shards, and reads at most two.
func TestAttackShardedKeyCardinality(t *testing.T) {
	lim := MustLimit(Spec{Name: "per-key", TokensPerSecond: 10, Burst: 64, Shards: 64})
	c := &takeCounter{charged: map[string]bool{}}
	l := New(c)
	for i := range 100 {
		key := "k" + strings.Repeat("x", i)
		if _, err := l.Take(context.Background(), Request{Limit: lim, Key: key, Cost: 1.5}); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.charged) > 200 || c.peeked > 200 {
		t.Fatalf("100 takes on fresh keys charged %d keys and read %d; want at most two each", len(c.charged), c.peeked)
	}
}
