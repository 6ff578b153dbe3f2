package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/postgres"
)

func TestConformance(t *testing.T) { conformance.Run(t, newStore) }

// At most 24 goroutines: the pool's connections (pool in main_test.go).
// More would wait for a connection in this process, not for the row.
func TestInvariants(t *testing.T) {
	conformance.RunInvariants(t, newStore, conformance.InvariantOptions{Rounds: 40, Goroutines: []int{1, 8, 24}})
}

// A limit reloaded with a slower rate keeps a drained key drained: the
// row is converted to the new rate (not read as a full bucket), and its
// full_at, which the old limit set to its own time to full, becomes the
// new one's at the first decision that reads it, even a rejection:
// housekeeping deletes a row once full_at has passed, and a deleted row is
// a full bucket.
func TestAttackReloadSlowerRateKeepsDrainedKey(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(11_000_000_000_000))
	s := newStoreOpts(t, postgres.Options{Clock: clock})
	ctx := context.Background()
	old := sluice.MustLimit(sluice.Spec{Name: "reload-per-user", Rate: 30, Period: time.Minute})
	slower := sluice.MustLimit(sluice.Spec{Name: old.Name(), Rate: 10, Period: time.Minute, Capacity: 30})
	if d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: old, Key: "u", Cost: 30}); err != nil || !d.Allowed {
		t.Fatalf("drain: %v %+v", err, d)
	}
	clock.Advance(time.Second)
	if d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: slower, Key: "u"}); err != nil || d.Allowed {
		t.Fatalf("after the reload the drained key got %+v (%v), want a rejection", d, err)
	}
	// 61 s after the drain: full under the old limit, a sixth under the new.
	clock.Advance(time.Minute)
	if n, err := s.Housekeep(ctx); err != nil || n != 0 {
		t.Fatalf("housekeeping deleted %d rows (%v) at the old limit's time to full", n, err)
	}
	d, err := conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: slower, Key: "u"})
	if err != nil || d.Tokens > 61.0/6 {
		t.Fatalf("61 s after the drain at 10/min: %+v (%v), want at most 10.17 tokens", d, err)
	}
}

// A fixed window's row written before the store recorded the capacity in
// its den column (0 there) keeps working, taken as counted under the
// current limit; the next write records the capacity.
func TestFixedWindowRowWithoutCapacity(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1000 * 1_000_000))
	s := newStoreOpts(t, postgres.Options{Clock: clock})
	ctx := context.Background()
	start := time.Duration(0)
	lim := sluice.MustLimit(sluice.Spec{Name: fmt.Sprintf("legacy-fw-%d", time.Now().UnixNano()), Algorithm: sluice.FixedWindow, Rate: 5, Period: time.Minute, Start: &start})
	if d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil || !d.Allowed {
		t.Fatalf("first take: %+v (%v)", d, err)
	}
	key := []byte(lim.StorageKey("k"))
	// As an older version wrote it: no capacity, 1 token left.
	tag, err := s.Pool().Exec(ctx, `UPDATE sluice_buckets SET den = 0, a = 1000000 WHERE position($1::bytea in key) > 0`, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("update: %v (%d rows)", err, tag.RowsAffected())
	}
	for i, want := range []bool{true, false} {
		d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		if err != nil || d.Allowed != want || d.Remaining != 0 {
			t.Fatalf("take %d: %+v (%v), want allowed %v with none left", i+1, d, err, want)
		}
	}
	var den int64
	if err := s.Pool().QueryRow(ctx, `SELECT den FROM sluice_buckets WHERE position($1::bytea in key) > 0`, key).Scan(&den); err != nil || den != 5_000_000 {
		t.Fatalf("den after a write: %d (%v), want the capacity, 5000000", den, err)
	}
}

// Attack: a key of a few kilobytes (an application keying the library by
// a header or a path as the client sent it). The memory and Redis stores
// keep its bucket; PostgreSQL's primary key index refused any row key
// longer than about 2.7 KB, so every take of such a key was an error, and
// an application that lets a request through when its limiter fails
// (sluice serve's on_store_error: allow) let the client through
// unlimited. Long keys are kept as a prefix and a hash of the whole.
func TestAttackLongKeyEscapesPostgres(t *testing.T) {
	s := newStoreOpts(t, postgres.Options{})
	ctx := context.Background()
	l := sluice.New(s)
	lim := sluice.MustLimit(sluice.Spec{Name: "long-keys", TokensPerSecond: 1, Burst: 1})
	conc := sluice.MustLimit(sluice.Spec{Name: "long-keys-conc", Algorithm: sluice.Concurrency, MaxInFlight: 1})
	win := sluice.MustLimit(sluice.Spec{Name: "long-keys-win", Algorithm: sluice.SlidingWindow, Rate: 1, Period: time.Hour})
	// Random bytes: a key that compresses is stored compressed.
	b := make([]byte, 10_000)
	rand.NewChaCha8([32]byte{1}).Read(b)
	long := string(b)
	for _, k := range []string{long + "1", long + "2", long[:3000]} {
		for _, lm := range []*sluice.Limit{lim, win} {
			if d, err := l.Take(ctx, sluice.Request{Limit: lm, Key: k}); err != nil || !d.Allowed {
				t.Fatalf("%s: first take of a %d-byte key: %+v %v, want allowed", lm.Name(), len(k), d, err)
			}
			if d, err := l.Take(ctx, sluice.Request{Limit: lm, Key: k}); err != nil || d.Allowed {
				t.Fatalf("%s: second take of a %d-byte key: %+v %v, want refused (its bucket is kept)", lm.Name(), len(k), d, err)
			}
		}
		if _, d, err := l.Acquire(ctx, sluice.Request{Limit: conc, Key: k}); err != nil || !d.Allowed {
			t.Fatalf("acquire of a %d-byte key: %+v %v, want allowed", len(k), d, err)
		}
		if err := l.Reset(ctx, lim, k); err != nil {
			t.Fatalf("reset of a %d-byte key: %v", len(k), err)
		}
		if d, err := l.Take(ctx, sluice.Request{Limit: lim, Key: k}); err != nil || !d.Allowed {
			t.Fatalf("take after reset of a %d-byte key: %+v %v, want allowed", len(k), d, err)
		}
	}
}
