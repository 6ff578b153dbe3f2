package quota_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/quota"
)

var ctx = context.Background()

var epoch = time.Unix(1_700_000_000, 0)

// A quota.Store that leases nothing is the store it wraps.
func TestConformancePassThrough(t *testing.T) {
	conformance.Run(t, func(t *testing.T, clock sluice.Clock) sluice.Store {
		return quota.New(memory.New(memory.Options{Clock: clock}), quota.Options{Clock: clock})
	})
}

func TestMaxSlice(t *testing.T) {
	const M = engine.TokenScale
	for _, c := range []struct {
		capacity int64
		set      quota.Settings
		want     int64
	}{
		{20_000 * M, quota.Settings{}, 60 * M},                  // 0.3% by default
		{20_000 * M, quota.Settings{MaxShare: 0.01}, 200 * M},   // a share
		{20_000 * M, quota.Settings{MaxSlice: 25}, 25 * M},      // tokens
		{20_000 * M, quota.Settings{MaxSlice: 1e9}, 20_000 * M}, // never above the capacity
		{100 * M, quota.Settings{}, 0},                          // 0.3 tokens: exact
		{1000 * M, quota.Settings{}, 3 * M},
		{1000 * M, quota.Settings{MaxSlice: 1.5}, 0},
	} {
		if got := quota.MaxSlice(c.capacity, c.set); got != c.want {
			t.Errorf("MaxSlice(%d, %+v) = %d, want %d", c.capacity, c.set, got, c.want)
		}
	}
}

// The defaults keep a hot global key within 1% of its limit at three
// processes.
func TestDefaultBoundWithinOnePercent(t *testing.T) {
	for _, capacity := range []float64{1000, 20_000, 1e6} {
		lim := sluice.MustLimit(sluice.Spec{Name: "g", TokensPerSecond: capacity, Burst: capacity})
		if o := quota.Overshoot(lim, quota.Settings{}, 3); o <= 0 || o > 0.01*capacity {
			t.Errorf("capacity %v: 3 processes may overshoot by %v, want within 1%%", capacity, o)
		}
	}
}

func TestNextSize(t *testing.T) {
	const term = time.Second
	for _, c := range []struct {
		size, left int64
		held       time.Duration
		want       int64
	}{
		{4, 0, 100 * time.Millisecond, 8}, // used up early: doubles
		{64, 0, 100 * time.Millisecond, 100},
		{4, 0, 800 * time.Millisecond, 4}, // used up late: keeps
		{8, 5, term, 4},                   // more than half unused: halves
		{2, 2, term, 2},                   // never below the least
		{8, 3, term, 8},
	} {
		if got := quota.NextSize(c.size, c.left, 2, 100, c.held, term); got != c.want {
			t.Errorf("NextSize(%d, %d, held %v) = %d, want %d", c.size, c.left, c.held, got, c.want)
		}
	}
}

func TestExactAdmits(t *testing.T) {
	tb := sluice.MustLimit(sluice.Spec{Name: "tb", TokensPerSecond: 100, Burst: 50})
	if got := quota.ExactAdmits(tb, 2*time.Second); got != 250 {
		t.Errorf("token bucket over 2s: %v, want 250", got)
	}
	fw := sluice.MustLimit(sluice.Spec{Name: "fw", Algorithm: sluice.FixedWindow, Rate: 100, Period: time.Second})
	if got := quota.ExactAdmits(fw, time.Second); got != 200 {
		t.Errorf("fixed window over one period: %v, want 200 (two windows touched)", got)
	}
	if got := quota.ExactAdmits(fw, 1500*time.Millisecond); got != 300 {
		t.Errorf("fixed window over 1.5 periods: %v, want 300", got)
	}
}

// The window a slice is charged to ends when the store says, counted
// from when the take was sent: however slow its answer, never later.
func TestWindowUseBy(t *testing.T) {
	fw := sluice.MustLimit(sluice.Spec{Name: "fw", Algorithm: sluice.FixedWindow, Rate: 100, Capacity: 300, Period: time.Second})
	p := fw.Params()
	clock := sluice.NewManualClock(epoch)
	s := memory.New(memory.Options{Clock: clock})
	start := int64(0)
	p2 := *p
	_ = p2
	for _, into := range []time.Duration{0, 300 * time.Millisecond, 999 * time.Millisecond} {
		for _, spent := range []float64{10, 150, 250} {
			key := "k" + strconv.Itoa(int(into)) + "-" + strconv.Itoa(int(spent))
			off := time.Duration(engine.WindowOffset(key, p.Period)) * time.Microsecond
			_ = start
			// Move to into past a window start of the key.
			base := epoch.Truncate(time.Second).Add(off).Add(10 * time.Second)
			clock.Set(base.Add(into))
			d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: fw, Key: key, Cost: spent})
			if err != nil || !d.Allowed {
				t.Fatalf("take: %+v %v", d, err)
			}
			got := quota.WindowUseBy(p, base.Add(into), d, 0)
			if want := base.Add(time.Second); !got.Equal(want) {
				t.Errorf("into %v, spent %v: use-by %v, want the window's end %v (decision %+v)", into, spent, got.Sub(base), want.Sub(base), d)
			}
		}
	}
}

func limitTB(t *testing.T, rate, burst float64) *sluice.Limit {
	return sluice.MustLimit(sluice.Spec{Name: uniqueName(t, "tb"), TokensPerSecond: rate, Burst: burst})
}

// A key seen fewer than hot_after times per term never holds a slice:
// every request reaches the store, and what it admits is exact.
func TestColdKeyStaysExact(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	mem := memory.New(memory.Options{Clock: clock})
	coldCase(t, clock, func() sluice.Store { return mem })
}

func coldCase(t *testing.T, clock *sluice.ManualClock, open func() sluice.Store) {
	lim := limitTB(t, 10_000, 10_000)
	set := quota.Settings{MaxSlice: 100, HotAfter: 8}
	f := newFleet(t, clock, lim, set, 3, open)
	for range 50 {
		for _, q := range f.procs {
			for range 7 {
				if d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "cold"}); err != nil || !d.Allowed {
					t.Fatalf("%+v %v", d, err)
				}
			}
		}
		clock.Advance(time.Second)
	}
	for i, q := range f.procs {
		for _, st := range q.Stats() {
			if st.Taken != 0 || st.Held != 0 {
				t.Errorf("process %d took %d slices of a cold key (holds %v)", i, st.Taken, st.Held)
			}
		}
	}
	if got := f.storeCalls(); got != 50*3*7 {
		t.Errorf("store calls %d, want one per request (%d)", got, 50*3*7)
	}
}

// A hot key leases: the store sees far fewer calls than requests, and
// the fleet stays within the bound over every window.
func TestHotKeyBoundMemory(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	mem := memory.New(memory.Options{Clock: clock})
	lim := limitTB(t, 20_000, 20_000)
	set := quota.Settings{} // 0.3%: 60 tokens
	f := newFleet(t, clock, lim, set, 3, func() sluice.Store { return mem })
	// 3 processes x 200 requests every 5ms: 120,000/s of cost 1-2, three
	// to nine times the limit, so that the limit binds.
	f.hammer(ctx, "global", 600, 5*time.Millisecond, 200, nil)
	for _, d := range []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, time.Second} {
		f.checkBound(d, 0)
	}
	requests := int64(600 * 3 * 200)
	if calls := f.storeCalls(); calls*4 > requests {
		t.Errorf("%d store calls for %d requests: leasing saved too little", calls, requests)
	}
	f.close(ctx)
}

// Stats report slices and tokens held; Close returns them all.
func TestCloseReturnsSlices(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	mem := memory.New(memory.Options{Clock: clock})
	lim := limitTB(t, 1, 1000) // refills slowly: what is held shows
	q := quota.New(mem, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 50, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	st := q.Stats()[0]
	if st.Taken == 0 || st.Held <= 0 || st.Held > 50 {
		t.Fatalf("stats %+v: want slices taken and 0 < held <= 50", st)
	}
	peek := func() float64 {
		d, err := conformance.Take(ctx, mem, engine.OpPeek, sluice.Request{Limit: lim, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		return d.Tokens + 1 // a peek answers after a take of one
	}
	before := peek()
	if before+st.Held+20 != 1000 {
		t.Errorf("store %v + held %v + admitted 20 != capacity 1000", before, st.Held)
	}
	if err := q.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if after := peek(); after != 980 {
		t.Errorf("after Close the store holds %v, want 980: every unused token returned", after)
	}
	// Closed: exact from then on.
	if _, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if after := peek(); after != 979 {
		t.Errorf("a take after Close left %v, want 979", after)
	}
}

// A slice that outlives its term goes back to the store at the next
// request of its key, or at Sweep.
func TestSliceExpiresAndReturns(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	c := &counting{Store: memory.New(memory.Options{Clock: clock})}
	lim := limitTB(t, 0.001, 1000)
	q := quota.New(c, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 50, HotAfter: 1, Term: time.Second}}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Second)
	if err := q.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	st := q.Stats()[0]
	if st.Held != 0 || st.Returned != 1 || c.refunds.Load() != 1 {
		t.Errorf("after its term: %+v, %d refunds; want the slice returned", st, c.refunds.Load())
	}
	clock.Advance(3 * time.Second)
	if err := q.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if st := q.Stats()[0]; st.Keys != 0 {
		t.Errorf("an idle key is still followed: %+v", st)
	}
}

// Requests of one key in one process wait for the one slice take in
// flight, instead of all going to the store.
func TestOneTakeInFlightPerKey(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	c := &counting{Store: memory.New(memory.Options{Clock: clock}), slowTake: make(chan struct{}), started: make(chan struct{})}
	lim := limitTB(t, 1000, 1000)
	q := quota.New(c, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 100, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 16)
	for range 16 {
		go func() {
			_, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
			done <- err
		}()
	}
	<-c.started
	close(c.slowTake)
	for range 16 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if m := c.most.Load(); m != 1 {
		t.Errorf("%d takes of one key were in flight at once, want 1", m)
	}
}

// A refused slice is not the answer: the request is decided exactly.
func TestRefusedSliceFallsBackToExact(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	mem := memory.New(memory.Options{Clock: clock})
	lim := limitTB(t, 0.001, 10)
	q := quota.New(mem, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 8, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 30 {
		d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		} else if d.RetryAfter <= 0 {
			t.Errorf("a rejection without a wait: %+v", d)
		}
	}
	if admitted != 10 {
		t.Errorf("admitted %d of a bucket of 10, want exactly 10 (one process, no time passing)", admitted)
	}
}

// TakeAll is all-or-nothing with a leased member: when the exact member
// refuses, the leased member's tokens go back to its slice.
func TestTakeAllAllOrNothing(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	takeAllCase(t, clock, memory.New(memory.Options{Clock: clock}))
}

func takeAllCase(t *testing.T, clock *sluice.ManualClock, mem sluice.Store) {
	leased := limitTB(t, 1000, 1000)
	exact := limitTB(t, 0.001, 3)
	q := quota.New(mem, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{leased: {MaxSlice: 50, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	rs := []sluice.Request{{Limit: leased, Key: "g"}, {Limit: exact, Key: "u"}}
	for i := range 10 {
		ds, err := conformance.TakeAll(ctx, q, engine.OpTake, rs, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 2 || ds[0].Rule != leased.Name() || ds[1].Rule != exact.Name() {
			t.Fatalf("decisions out of order: %+v", ds)
		}
		if want := i < 3; ds[1].Allowed != want {
			t.Fatalf("request %d: exact member allowed %v, want %v", i, ds[1].Allowed, want)
		}
	}
	st := q.Stats()[0]
	d, err := conformance.Take(ctx, mem, engine.OpPeek, sluice.Request{Limit: leased, Key: "g"})
	if err != nil {
		t.Fatal(err)
	}
	// Three batches admitted: 3 tokens of the leased limit used, the rest
	// in the store or in the slice.
	if got := d.Tokens + 1 + st.Held; got != 997 { // a peek answers after a take of one
		t.Errorf("store %v + slice %v = %v, want 997: refused batches charged the leased member", d.Tokens, st.Held, got)
	}
}

// A fixed window's slice is used only inside the window it was charged
// to: with one process and no late refunds, no window admits more than
// the capacity, leasing or not.
func TestFixedWindowSliceStaysInItsWindow(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	mem := memory.New(memory.Options{Clock: clock})
	lim := sluice.MustLimit(sluice.Spec{Name: uniqueName(t, "fw"), Algorithm: sluice.FixedWindow, Rate: 1000, Period: 100 * time.Millisecond})
	set := quota.Settings{MaxSlice: 40, HotAfter: 1, Term: time.Second}
	f := newFleet(t, clock, lim, set, 3, func() sluice.Store { return mem })
	f.hammer(ctx, "w", 400, 3*time.Millisecond, 60, nil)
	f.checkWindows("w")
	f.checkBound(100*time.Millisecond, 0)
	f.close(ctx)
}

func TestConfigureRefusesWhatCannotLease(t *testing.T) {
	q := quota.New(memory.New(memory.Options{}), quota.Options{})
	for _, spec := range []sluice.Spec{
		{Name: "log", Algorithm: sluice.SlidingLog, Rate: 10, Period: time.Second},
		{Name: "leaky", Algorithm: sluice.LeakyBucket, TokensPerSecond: 10},
		{Name: "reserve", TokensPerSecond: 10, Burst: 10, Reserve: true},
		{Name: "sharded", TokensPerSecond: 1000, Burst: 1000, Shards: 4},
	} {
		lim, err := sluice.NewLimit(spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {}}); !errors.Is(err, quota.ErrNotLeasable) {
			t.Errorf("%s: %v, want ErrNotLeasable", spec.Name, err)
		}
	}
	lim := limitTB(t, 10, 10)
	for _, set := range []quota.Settings{{MaxSlice: -1}, {MaxShare: 2}, {Term: time.Microsecond}, {HotAfter: -1}} {
		if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: set}); err == nil {
			t.Errorf("%+v accepted", set)
		}
	}
}

// Reconfiguring returns the slices of the limits leased before.
func TestConfigureReturnsOldSlices(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	mem := memory.New(memory.Options{Clock: clock})
	lim := limitTB(t, 0.001, 1000)
	q := quota.New(mem, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 50, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Configure(nil); err != nil {
		t.Fatal(err)
	}
	d, err := conformance.Take(ctx, mem, engine.OpPeek, sluice.Request{Limit: lim, Key: "k"})
	if err != nil || d.Tokens+1 != 995 { // a peek answers after a take of one
		t.Errorf("after a reload that leases nothing the store holds %v (%v), want 995", d.Tokens, err)
	}
}

// A client that makes up keys, each hot, to make the process hold a slice
// of every one: the keys followed, and so the slices and the tokens held,
// stay within Options.MaxKeys; the keys beyond are decided exactly.
func TestAttackManyKeysBoundSlices(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	mem := memory.New(memory.Options{Clock: clock})
	lim := limitTB(t, 1000, 1000)
	q := quota.New(mem, quota.Options{Clock: clock, MaxKeys: 100})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 50, HotAfter: 2}}); err != nil {
		t.Fatal(err)
	}
	for i := range 5000 {
		key := "made-up-" + strconv.Itoa(i)
		for range 3 {
			d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: key})
			if err != nil || !d.Allowed {
				t.Fatalf("%+v %v", d, err)
			}
		}
	}
	st := q.Stats()[0]
	if st.Keys > 100 || st.Held > 100*50 || st.Taken > 100 {
		t.Errorf("after 5000 made-up keys: %d keys followed, %d slices taken, %v tokens held; want at most 100 keys and their slices", st.Keys, st.Taken, st.Held)
	}
}

// Attack: a key read from a query parameter is a piece of the request
// line (up to max_header_bytes). The keys a rule follows were kept as
// they came, so each of up to MaxKeys followed keys kept a whole line:
// fresh keys with padded queries had one process hold MaxKeys x 64 KiB.
// A followed key is a copy of its own.
func TestAttackLongRequestLinesHeldByFollowedKeys(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	mem := memory.New(memory.Options{Clock: clock})
	lim := limitTB(t, 1000, 1000)
	q := quota.New(mem, quota.Options{Clock: clock, MaxKeys: 10_000})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 50, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	pad := strings.Repeat("x", 64<<10)
	before := heap()
	const n = 2000
	for i := range n {
		// As net/http makes it: the key, a piece of one string of the
		// request line.
		line := "GET /v1/items?api_key=k" + strconv.Itoa(i) + "&pad=" + pad + " HTTP/1.1"
		start := strings.Index(line, "k")
		key := line[start : start+strings.IndexByte(line[start:], '&')]
		if _, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	if st := q.Stats()[0]; st.Keys < n/2 {
		t.Fatalf("%d keys followed, want most of %d: the test no longer reaches the followed keys", st.Keys, n)
	}
	// The followed keys' own slots, against n x 64 KiB (125 MiB) when each
	// kept its line.
	if grew := int64(heap()) - int64(before); grew > 16<<20 {
		t.Errorf("%d followed keys hold %d MiB; want at most 16 MiB", n, grew>>20)
	}
	runtime.KeepAlive(q)
}

// A request that costs more than the max slice never makes a slice of
// its size: it is decided exactly, and the tokens held stay within the
// max slice.
func TestAttackHugeCostStaysExact(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	c := &counting{Store: memory.New(memory.Options{Clock: clock})}
	lim := limitTB(t, 0.001, 10_000)
	q := quota.New(c, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 30, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		for _, cost := range []float64{1, 4000} {
			if _, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "k", Cost: cost}); err != nil {
				t.Fatal(err)
			}
			if st := q.Stats()[0]; st.Held > 30 {
				t.Fatalf("after a request of cost %v the process holds %v tokens, above the max slice 30", cost, st.Held)
			}
		}
	}
	d, err := conformance.Take(ctx, c.Store, engine.OpPeek, sluice.Request{Limit: lim, Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	// 2 of the 4000-token requests fit in 10,000; the rest were refused
	// by the store, not charged.
	if used := 10_000 - (d.Tokens + 1) - q.Stats()[0].Held; used != 2*4000+4 {
		t.Errorf("%v tokens used, want 8004 (two large requests and four small)", used)
	}
}

// A refund (a caller's, or settlement's) goes to the store, as without
// leasing: it never adds tokens to a slice, where the store would not
// see them and the process could admit them on top of its slice.
func TestAttackRefundDoesNotMintIntoSlice(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	c := &counting{Store: memory.New(memory.Options{Clock: clock})}
	lim := limitTB(t, 0.001, 100)
	q := quota.New(c, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 10, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 200 {
		d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
		before := q.Stats()[0].Held
		// Refund far more than was taken: the store caps it at the
		// capacity; the slice must not grow.
		if _, err := conformance.Take(ctx, q, engine.OpRefund, sluice.Request{Limit: lim, Key: "k", Cost: 50}); err != nil {
			t.Fatal(err)
		}
		if after := q.Stats()[0].Held; after > before {
			t.Fatalf("a refund grew the slice from %v to %v tokens", before, after)
		}
	}
	if c.refundedMicro.Load() < 200*50*engine.TokenScale {
		t.Errorf("the store saw %v refunded tokens, want every refund (%d)", engine.FromMicroTokens(c.refundedMicro.Load()), 200*50)
	}
	_ = admitted
}

// The cost of the wrapper for a limit that is not leased, against the
// memory store alone: one atomic load and a map lookup.
func BenchmarkPassThrough(b *testing.B) {
	lim := sluice.MustLimit(sluice.Spec{Name: "bench", TokensPerSecond: 1e9, Burst: 1e9})
	leased := sluice.MustLimit(sluice.Spec{Name: "leased", TokensPerSecond: 1e9, Burst: 1e9})
	mem := memory.New(memory.Options{})
	q := quota.New(mem, quota.Options{})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{leased: {}}); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		store sluice.Store
		lim   *sluice.Limit
	}{{"memory", mem, lim}, {"quota-exact", q, lim}, {"quota-leased", q, leased}} {
		b.Run(c.name, func(b *testing.B) {
			l := sluice.New(c.store)
			r := sluice.Request{Limit: c.lim, Key: "k"}
			for b.Loop() {
				if _, err := l.Take(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A slice left over at a window's end is not spent in the next window:
// there the store's full capacity is all that passes.
func TestFixedWindowLeftoverNotUsedInNextWindow(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	mem := memory.New(memory.Options{Clock: clock})
	lim := sluice.MustLimit(sluice.Spec{Name: uniqueName(t, "fw"), Algorithm: sluice.FixedWindow, Rate: 100, Period: time.Second})
	q := quota.New(mem, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 40, HotAfter: 1, Term: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	off := time.Duration(engine.WindowOffset("k", lim.Params().Period)) * time.Microsecond
	start := epoch.Truncate(time.Second).Add(off).Add(10 * time.Second)
	take := func() bool {
		d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	// Late in a window: a few requests, leaving part of a slice unused.
	clock.Set(start.Add(900 * time.Millisecond))
	for range 9 {
		take()
	}
	if q.Stats()[0].Held == 0 {
		t.Fatal("no slice left over: the test shows nothing")
	}
	// The next window: its capacity, not a token more.
	clock.Set(start.Add(time.Second))
	admitted := 0
	for range 300 {
		if take() {
			admitted++
		}
	}
	if admitted > 100 {
		t.Errorf("the next window admitted %d, above its capacity 100: a slice outlived its window", admitted)
	}
}

// A hot key over its limit is refused here until the store's wait ends,
// without a store call per request; a refund or a reset ends that.
func TestRefusalKeptUntilRetryAfter(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	c := &counting{Store: memory.New(memory.Options{Clock: clock})}
	lim := limitTB(t, 1, 10)
	q := quota.New(c, quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 4, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	take := func() sluice.Decision {
		d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for range 10 {
		if !take().Allowed {
			t.Fatal("refused within the burst")
		}
	}
	d := take()
	if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
		t.Fatalf("the 11th: %+v, want a refusal for up to a second", d)
	}
	calls := c.takes.Load()
	for range 100 {
		if take().Allowed {
			t.Fatal("admitted over the limit with no time passing")
		}
	}
	if n := c.takes.Load() - calls; n != 0 {
		t.Errorf("%d store calls for 100 refusals the store had already made", n)
	}
	if _, err := conformance.Take(ctx, q, engine.OpRefund, sluice.Request{Limit: lim, Key: "k", Cost: 3}); err != nil {
		t.Fatal(err)
	}
	if !take().Allowed {
		t.Error("refused after a refund of 3 tokens")
	}
	clock.Advance(time.Second)
	if !take().Allowed {
		t.Error("refused a second later, when a token had come")
	}
}

// gated wraps a store and holds the calls it is told to hold: a take of
// hold micro-tokens (a slice's take), and every TakeAll, until released.
type gated struct {
	sluice.Store
	mu         sync.Mutex
	holdTake   int64
	takeIn     chan struct{}
	takeOut    chan struct{}
	takeAllIn  chan struct{}
	takeAllOut chan struct{}
}

func (g *gated) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	g.mu.Lock()
	hold := op == engine.OpTake && g.holdTake != 0 && r.Cost == g.holdTake
	if hold {
		g.holdTake = 0
	}
	g.mu.Unlock()
	if hold {
		close(g.takeIn)
		<-g.takeOut
	}
	return g.Store.Take(ctx, op, r)
}

func (g *gated) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	if g.takeAllIn != nil {
		close(g.takeAllIn)
		<-g.takeAllOut
	}
	return g.Store.TakeAll(ctx, op, rs, dst)
}

// A client whose own (exact) limit refuses every request it sends makes
// the leased global key's slice charge and then take back its cost
// (TakeAll's put-back). A put-back that lands while the key's next
// slice is on its way is added to the slice the top-up was sized
// without: the process then holds more than max_slice tokens of the
// key, all counted by the store already, and the fleet's overshoot
// bound (processes x max_slice) no longer holds.
func TestAttackPutBackDuringTopUpExceedsMaxSlice(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	g := &gated{Store: memory.New(memory.Options{Clock: clock})}
	global := limitTB(t, 0.001, 10_000)
	own := limitTB(t, 0.001, 1) // the attacker's per-client limit
	q := quota.New(g, quota.Options{Clock: clock})
	const maxSlice = 10
	if err := q.Configure(map[*sluice.Limit]quota.Settings{global: {MaxSlice: maxSlice, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	take := func(cost float64) {
		t.Helper()
		if d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: global, Key: "g", Cost: cost}); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
	}
	// Slices of 2, 4 and 8 tokens, taken as they run out: the slice
	// holds 6.
	for range 8 {
		take(1)
	}
	if h := q.Stats()[0].Held; h != 6 {
		t.Fatalf("the slice holds %v tokens, want 6", h)
	}
	// The attacker uses up its own limit.
	if d, err := conformance.Take(ctx, g.Store, engine.OpTake, sluice.Request{Limit: own, Key: "attacker"}); err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	// Its request, costing the slice's 6 tokens of the global limit: charged to the slice,
	// then held at the store while its own limit is asked.
	g.takeAllIn, g.takeAllOut = make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		ds, err := conformance.TakeAll(ctx, q, engine.OpTake, []sluice.Request{{Limit: global, Key: "g", Cost: 6}, {Limit: own, Key: "attacker"}}, nil)
		if err == nil && ds[1].Allowed {
			t.Error("the attacker's own limit admitted it")
		}
		done <- err
	}()
	<-g.takeAllIn
	// Another client's request finds the slice empty and tops it up to
	// max_slice (10 tokens, from empty): that take is held at the store
	// too.
	g.mu.Lock()
	g.holdTake = maxSlice * engine.TokenScale
	g.mu.Unlock()
	g.takeIn, g.takeOut = make(chan struct{}), make(chan struct{})
	topped := make(chan struct{})
	go func() {
		defer close(topped)
		if d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: global, Key: "g"}); err != nil || !d.Allowed {
			t.Errorf("%+v %v", d, err)
		}
	}()
	<-g.takeIn
	// The attacker's request is refused by its own limit: its 6 tokens go
	// back into the slice, then the top-up lands.
	close(g.takeAllOut)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(g.takeOut)
	<-topped
	if h := q.Stats()[0].Held; h > maxSlice {
		t.Errorf("the process holds %v tokens of the key, above max_slice %d: the fleet's bound is processes x max_slice", h, maxSlice)
	}
}

// A client whose own limit refuses its requests makes a fixed window's
// slice charge them and then take them back (TakeAll's put-back). One
// that lands while the key's next slice is on its way, after the
// window's boundary, was added to that slice: tokens the store counted
// in the window before were admitted in the next, which then let more
// than its capacity through with every refund on time.
func TestAttackPutBackCarriesWindowIntoNext(t *testing.T) {
	zero := time.Duration(0)
	clock := sluice.NewManualClock(epoch.Add(500 * time.Millisecond))
	g := &gated{Store: memory.New(memory.Options{Clock: clock})}
	global := sluice.MustLimit(sluice.Spec{Name: uniqueName(t, "fw"), Algorithm: sluice.FixedWindow, Rate: 100, Period: time.Second, Start: &zero})
	own := limitTB(t, 0.001, 1) // the attacker's per-client limit
	q := quota.New(g, quota.Options{Clock: clock})
	const maxSlice = 10
	if err := q.Configure(map[*sluice.Limit]quota.Settings{global: {MaxSlice: maxSlice, HotAfter: 1, Term: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	take := func() bool {
		t.Helper()
		d, err := conformance.Take(ctx, q, engine.OpTake, sluice.Request{Limit: global, Key: "g"})
		if err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	// A first slice of 2 tokens, one of them left.
	if !take() {
		t.Fatal("the first request refused")
	}
	if h := q.Stats()[0].Held; h != 1 {
		t.Fatalf("the slice holds %v tokens, want 1", h)
	}
	if d, err := conformance.Take(ctx, g.Store, engine.OpTake, sluice.Request{Limit: own, Key: "attacker"}); err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	// The attacker's request takes the slice's last token, then is held
	// at the store while its own limit is asked.
	g.takeAllIn, g.takeAllOut = make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := conformance.TakeAll(ctx, q, engine.OpTake, []sluice.Request{{Limit: global, Key: "g"}, {Limit: own, Key: "attacker"}}, nil)
		done <- err
	}()
	<-g.takeAllIn
	// The next window: a request finds the slice empty and tops it up
	// (4 tokens, the size doubled); that take is held at the store.
	clock.Set(epoch.Add(time.Second + 100*time.Millisecond))
	g.mu.Lock()
	g.holdTake = 4 * engine.TokenScale
	g.mu.Unlock()
	g.takeIn, g.takeOut = make(chan struct{}), make(chan struct{})
	topped := make(chan bool, 1)
	go func() { topped <- take() }()
	<-g.takeIn
	// The attacker's own limit refuses it: its token goes back, then the
	// top-up lands.
	close(g.takeAllOut)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(g.takeOut)
	admitted := 0
	if <-topped {
		admitted++
	}
	for range 300 {
		if take() {
			admitted++
		}
	}
	if admitted > 100 {
		t.Errorf("the window after the put-back admitted %d, above its capacity 100: a token counted in the window before was spent in it", admitted)
	}
}
