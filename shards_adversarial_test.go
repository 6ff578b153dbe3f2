package sluice

import (
	"context"
	"strings"
	"sync"
	"testing"
)

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
			sk := "sluice:" + StorageKey(lim, lim.ShardKey(k, i))
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

func (c *takeCounter) note(op Op, rs []Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range rs {
		if op == OpTake {
			c.charged[StorageKey(r.Limit, r.Key)] = true
		} else {
			c.peeked++
		}
	}
}

func (c *takeCounter) Take(ctx context.Context, op Op, r Request) (Decision, error) {
	ds, err := c.TakeAll(ctx, op, []Request{r})
	if err != nil {
		return Decision{}, err
	}
	return ds[0], nil
}

func (c *takeCounter) TakeAll(_ context.Context, op Op, rs []Request) ([]Decision, error) {
	c.note(op, rs)
	ds := make([]Decision, len(rs))
	for i, r := range rs {
		if _, err := r.Charge(op); err != nil {
			return nil, err
		}
		ds[i] = r.Limit.Decide(Outcome{Allowed: true, Tokens: r.Limit.params.Capacity})
	}
	return ds, nil
}

func (c *takeCounter) Reset(context.Context, *Limit, string) error { return nil }

func (c *takeCounter) Lease(context.Context, Op, Request, LeaseID) (Decision, error) {
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
