package redis_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/redis"
)

// testSeq keeps each test's keys apart on a shared server: every test's
// limits are named uniquely (uniqueLimit), so StorageKey never collides.
var testSeq atomic.Int64

// open connects a store to url with test options; opts may adjust them.
// open opens a store for the test. A test that sets no Timeout checks
// answers, not deadlines: it gets deadlines no loaded machine reaches, the
// store's and the client's own (slowClientTimeouts).
func open(t testing.TB, url string, opts redis.Options) *redis.Store {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
		if !strings.Contains(url, "write_timeout=") {
			url = withQuery(url, slowClientTimeouts)
		}
	}
	s, err := redis.Open(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// slowClientTimeouts raises the client's own dial and write timeouts
// (1s each by default; the write timeout also gives up on a silent
// connection) far beyond any wait a loaded machine causes.
const slowClientTimeouts = "dial_timeout=30s&write_timeout=30s"

// withQuery adds query parameters to a store URL.
func withQuery(url, query string) string {
	if strings.Contains(url, "?") {
		return url + "&" + query
	}
	return url + "?" + query
}

// vectorStore adapts open to conformance.NewStore for the vectors: the
// test clock is passed in, the over-limit cache is off (its answers are
// rejections with approximate token counts; the vectors check exact ones),
// and every store gets a key prefix of its own, so each case starts from
// absent keys without flushing a server that SLUICE_REDIS_URL may share.
func vectorStore(url string, opts redis.Options) conformance.NewStore {
	return func(t *testing.T, clock sluice.Clock) sluice.Store {
		o := opts
		o.Clock = clock
		o.NoOverLimitCache = true
		o.KeyPrefix = fmt.Sprintf("test%d-%d:", time.Now().UnixNano(), testSeq.Add(1))
		return open(t, url, o)
	}
}

// servedStore is a conformance.NewStore for what a server runs: as
// vectorStore, but with the over-limit cache on.
func servedStore(url string) conformance.NewStore {
	return func(t *testing.T, clock sluice.Clock) sluice.Store {
		return open(t, url, redis.Options{Clock: clock, KeyPrefix: fmt.Sprintf("test%d-%d:", time.Now().UnixNano(), testSeq.Add(1))})
	}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, vectorStore(standaloneURL(t), redis.Options{}))
}

func TestConformanceNoBatch(t *testing.T) {
	conformance.Run(t, vectorStore(standaloneURL(t), redis.Options{NoBatch: true}))
}

func TestInvariants(t *testing.T) {
	conformance.RunInvariants(t, vectorStore(standaloneURL(t), redis.Options{}), conformance.InvariantOptions{Rounds: 60, Goroutines: []int{1, 16}})
}

func TestClusterConformance(t *testing.T) {
	conformance.Run(t, vectorStore(clusterURL(t), redis.Options{}))
}

func TestClusterInvariants(t *testing.T) {
	conformance.RunInvariants(t, vectorStore(clusterURL(t), redis.Options{}), conformance.InvariantOptions{Rounds: 40, Goroutines: []int{1, 16}})
}

// uniqueLimit returns a token bucket limit with a name no other test uses.
func uniqueLimit(t testing.TB, spec sluice.Spec) *sluice.Limit {
	spec.Name = fmt.Sprintf("%s-%d-%d", spec.Name, time.Now().UnixNano(), testSeq.Add(1))
	return sluice.MustLimit(spec)
}

// The limits the script cannot compute exactly are refused by Supports,
// which a server calls at start and on reload, and a request that reaches
// the store anyway is refused too.
func TestScaledCapacityBeyondLuaRefused(t *testing.T) {
	s := open(t, standaloneURL(t), redis.Options{})
	// 1e9 tokens with a rate of denominator 3: 3e15*3 scaled units > 2^52.
	lim := uniqueLimit(t, sluice.Spec{Name: "huge", Rate: 1, Period: 3 * time.Second, Capacity: 2e9})
	if err := s.Supports(lim); !errors.Is(err, sluice.ErrInvalidLimit) || !sluice.IsInputError(err) {
		t.Fatalf("Supports: want an input error wrapping ErrInvalidLimit, got %v", err)
	}
	if err := s.Supports(uniqueLimit(t, sluice.Spec{Name: "fine", Rate: 1, Period: 3 * time.Second, Capacity: 2e6})); err != nil {
		t.Fatalf("Supports refuses a limit the script computes exactly: %v", err)
	}
	_, err := conformance.Take(context.Background(), s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
	if !errors.Is(err, sluice.ErrInvalidLimit) || !sluice.IsInputError(err) {
		t.Fatalf("want an input error wrapping ErrInvalidLimit, got %v", err)
	}
	// A fixed window whose reset can lie more than 2^52us (142 years) ahead.
	decade := 10 * 365 * 24 * time.Hour
	fw := uniqueLimit(t, sluice.Spec{Name: "slow-fw", Algorithm: sluice.FixedWindow, Rate: 1, Period: decade, Capacity: 20})
	if err := redis.Supports(fw); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Fatalf("Supports: want ErrInvalidLimit for a 210-year refill, got %v", err)
	}
	if _, err := conformance.Take(context.Background(), s, engine.OpTake, sluice.Request{Limit: fw, Key: "k"}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Fatalf("want ErrInvalidLimit for a 210-year refill, got %v", err)
	}
}

func TestTTLIsTimeToFull(t *testing.T) {
	s := open(t, standaloneURL(t), redis.Options{})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "ttl", TokensPerSecond: 10, Burst: 50})
	start := time.Now()
	d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k", Cost: 20})
	if err != nil || !d.Allowed {
		t.Fatalf("take: %v %+v", err, d)
	}
	c := s.Client()
	key := lim.StorageKey("k")
	pttl, err := c.Do(ctx, c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	// 20 tokens at 10/s: full again in 2s, less what passed between the
	// take and the PTTL (at most what passed here around both).
	if passed := time.Since(start).Milliseconds(); pttl > 2000 || pttl < 2000-passed-1 {
		t.Fatalf("PTTL %dms %dms after the take, want 2000 less that", pttl, passed)
	}
	// A rejected take writes nothing: a write would have refilled the
	// state to the call's time, changing its stamp.
	before, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	if d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k", Cost: 40}); err != nil || d.Allowed {
		t.Fatalf("want a rejection: %v %+v", err, d)
	}
	if after, _ := c.Do(ctx, c.B().Get().Key(key).Build()).ToString(); after != before {
		t.Fatal("a rejected take rewrote the state")
	}
	// Peeks write nothing either.
	other := lim.StorageKey("peeked")
	if _, err := conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: lim, Key: "peeked"}); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Do(ctx, c.B().Exists().Key(other).Build()).AsInt64(); n != 0 {
		t.Fatal("a peek created a key")
	}
}

// A limit reloaded with a slower rate keeps a drained key drained: the
// state is converted to the new rate (not read as a full bucket), and the
// key's TTL, which the old limit set to its own time to full, is
// lengthened to the new one by the first decision that reads it, even a
// rejection: an expired key would be a full bucket.
func TestAttackReloadSlowerRateKeepsDrainedKey(t *testing.T) {
	s := open(t, standaloneURL(t), redis.Options{NoOverLimitCache: true})
	ctx := context.Background()
	old := uniqueLimit(t, sluice.Spec{Name: "per-user", Rate: 30, Period: time.Minute})
	slower := sluice.MustLimit(sluice.Spec{Name: old.Name(), Rate: 10, Period: time.Minute, Capacity: 30})
	start := time.Now()
	if d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: old, Key: "u", Cost: 30}); err != nil || !d.Allowed {
		t.Fatalf("drain: %v %+v", err, d)
	}
	d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: slower, Key: "u"})
	if err != nil || d.Allowed || d.Tokens >= 1 {
		t.Fatalf("after the reload the drained key got %+v (%v), want a rejection", d, err)
	}
	c := s.Client()
	pttl, err := c.Do(ctx, c.B().Pttl().Key(slower.StorageKey("u")).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	// 30 tokens at 10 a minute: full in 180 s from the drain, less what
	// passed since (at most what passed here); the old limit's TTL was
	// at most 60 s.
	if passed := time.Since(start).Milliseconds(); pttl > 180_000 || pttl < 180_000-passed-1 {
		t.Fatalf("PTTL %dms after the reload, want the new limit's time to full (about 180000ms)", pttl)
	}
}

// A value sluice did not write at a bucket's key (another type, a string
// of another shape) reads as a full bucket instead of failing the script,
// which would fail every take batched with it.
func TestForeignValueAtKey(t *testing.T) {
	s := open(t, standaloneURL(t), redis.Options{NoOverLimitCache: true})
	ctx := context.Background()
	c := s.Client()
	tb := uniqueLimit(t, sluice.Spec{Name: "foreign-tb", TokensPerSecond: 1, Burst: 3})
	sl := uniqueLimit(t, sluice.Spec{Name: "foreign-sl", Algorithm: sluice.SlidingLog, Rate: 3, Period: time.Second})
	if err := c.Do(ctx, c.B().Hset().Key(tb.StorageKey("k")).FieldValue().FieldValue("a", "b").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, c.B().Set().Key(sl.StorageKey("k")).Value("garbage").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	ds, err := conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{{Limit: tb, Key: "k"}, {Limit: sl, Key: "k"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !ds[0].Allowed || ds[0].Remaining != 2 || !ds[1].Allowed || ds[1].Remaining != 2 {
		t.Fatalf("want full buckets charged once, got %+v", ds)
	}
}

// A fixed window's state written before the store recorded the capacity
// with it (16 bytes: tokens and window start) keeps working, taken as
// counted under the current limit; the next write records the capacity.
func TestFixedWindowStateWithoutCapacity(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1000 * 1_000_000))
	s := open(t, standaloneURL(t), redis.Options{NoOverLimitCache: true, Clock: clock})
	ctx := context.Background()
	start := time.Duration(0)
	lim := uniqueLimit(t, sluice.Spec{Name: "legacy-fw", Algorithm: sluice.FixedWindow, Rate: 5, Period: time.Minute, Start: &start})
	key := lim.StorageKey("k")
	var old [16]byte
	binary.LittleEndian.PutUint64(old[:8], math.Float64bits(1_000_000))     // 1 token left
	binary.LittleEndian.PutUint64(old[8:], math.Float64bits(960*1_000_000)) // in the window from 960 s
	c := s.Client()
	if err := c.Do(ctx, c.B().Set().Key(key).Value(string(old[:])).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		if err != nil || d.Allowed != want || d.Remaining != 0 {
			t.Fatalf("take %d: %+v (%v), want allowed %v with none left", i+1, d, err, want)
		}
	}
	raw, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
	if err != nil || len(raw) != 24 {
		t.Fatalf("state after a write: %d bytes (%v), want 24 (the capacity recorded)", len(raw), err)
	}
	if got := math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[16:]))); got != 5_000_000 {
		t.Fatalf("recorded capacity %v, want 5000000", got)
	}
}

func TestKeyPrefix(t *testing.T) {
	s := open(t, standaloneURL(t)+"?key_prefix=app1:", redis.Options{})
	ctx := context.Background()
	lim := uniqueLimit(t, sluice.Spec{Name: "prefix", TokensPerSecond: 1, Burst: 2})
	if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil {
		t.Fatal(err)
	}
	c := s.Client()
	if n, _ := c.Do(ctx, c.B().Exists().Key("app1:"+lim.StorageKey("k")).Build()).AsInt64(); n != 1 {
		t.Fatal("prefixed key not written")
	}
	if err := s.Reset(ctx, lim, "k"); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Do(ctx, c.B().Exists().Key("app1:"+lim.StorageKey("k")).Build()).AsInt64(); n != 0 {
		t.Fatal("Reset left the prefixed key")
	}
	if _, err := redis.New(c, redis.Options{KeyPrefix: "{x}:"}); err == nil {
		t.Fatal("a hash tag in the prefix was accepted")
	}
}

// One batch writer (?batch_writers=1) carries every concurrent take:
// exactly the burst is admitted, no more, no less.
func TestBatchWritersFromURL(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(8_000_000_000_000))
	s := open(t, standaloneURL(t)+"?batch_writers=1", redis.Options{Clock: clock})
	lim := uniqueLimit(t, sluice.Spec{Name: "writers", TokensPerSecond: 1, Burst: 50})
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				d, err := conformance.Take(context.Background(), s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := admitted.Load(); n != 50 {
		t.Fatalf("%d of 160 takes admitted, want the burst of 50", n)
	}
}

// Concurrent takes, some of them given up while they wait for a batch,
// each get the reply to their own request: the batch's calls are reused
// once answered (batch.go), and a call given up is never handed to
// another caller. Each caller takes from a key of its own that does not
// refill, so every answer it gets says fewer tokens than the one before
// (a take given up may or may not have been applied; it never adds).
func TestBatchedRepliesReachTheirCallers(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(8_000_000_000_000))
	s := open(t, standaloneURL(t)+"?batch_writers=2", redis.Options{Clock: clock})
	lim := uniqueLimit(t, sluice.Spec{Name: "replies", TokensPerSecond: 1, Burst: 10_000})
	var answered, gaveUp atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "caller-" + strconv.Itoa(g)
			last := int64(math.MaxInt64)
			for i := range 60 {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if i%3 == 1 {
					// Given up at once or soon after, wherever the call is.
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%4)*time.Microsecond)
				}
				d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: key})
				cancel()
				if err != nil {
					if ctx.Err() == nil {
						t.Error(err)
						return
					}
					gaveUp.Add(1)
					continue
				}
				if d.Remaining >= last {
					t.Errorf("%s: %d tokens after a take that left %d: another caller's reply", key, d.Remaining, last)
					return
				}
				last = d.Remaining
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d takes answered, %d given up", answered.Load(), gaveUp.Load())
}
