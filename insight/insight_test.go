package insight

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
)

// TestSpaceSavingBounds checks the error bound the package documents on
// skewed and uniform streams of far more distinct keys than counters:
// every counter's count overestimates its key's true count by at most its
// err, err is at most N/k, and every key seen more than N/k times has a
// counter.
func TestSpaceSavingBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		next func(r *rand.Rand) int
	}{
		{"zipf", func() func(r *rand.Rand) int {
			return func(r *rand.Rand) int { return int(rand.NewZipf(r, 1.2, 1, 100000).Uint64()) }
		}()},
		{"uniform", func(r *rand.Rand) int { return r.IntN(5000) }},
		{"one-hot-in-noise", func(r *rand.Rand) int {
			if r.IntN(10) == 0 {
				return -1
			}
			return r.IntN(1 << 20)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const k = 64
			r := rand.New(rand.NewPCG(1, 2))
			s := newSpaceSaving(k)
			exact := map[Item]uint64{}
			for range 50000 {
				it := Item{Limit: "l", Key: fmt.Sprint(tc.next(r))}
				exact[it]++
				s.add(it, hashItem(it), false)
			}
			checkStreamSummary(t, s)
			n := s.total
			if n != 50000 {
				t.Fatalf("total %d", n)
			}
			var sum uint64
			for slot := range s.n {
				c := s.counter(int32(slot))
				sum += c.count
				tr := exact[c.item]
				if c.count < tr || c.count-c.err > tr {
					t.Errorf("%v: count %d err %d, true %d", c.item, c.count, c.err, tr)
				}
				if c.err > n/k {
					t.Errorf("%v: err %d > N/k = %d", c.item, c.err, n/k)
				}
			}
			if sum != n {
				t.Errorf("counters sum to %d, N = %d", sum, n)
			}
			for it, tr := range exact {
				if _, ok := s.lookup(it); tr > n/k && !ok {
					t.Errorf("%v seen %d > N/k = %d times has no counter", it, tr, n/k)
				}
				if _, ok := s.lookup(it); !ok && tr > s.min() {
					t.Errorf("%v seen %d times without a counter, above the smallest %d", it, tr, s.min())
				}
			}
		})
	}
}

// TestMergedBound checks the merged ranking of two periods: each key's
// true count over both lies within Count±Error, Error within the bound.
func TestMergedBound(t *testing.T) {
	const k = 32
	r := rand.New(rand.NewPCG(3, 4))
	a, b := newSpaceSaving(k), newSpaceSaving(k)
	exact := map[Item]uint64{}
	for i := range 20000 {
		it := Item{Limit: "l", Key: fmt.Sprint(rand.NewZipf(r, 1.1, 1, 10000).Uint64())}
		exact[it]++
		if i < 8000 {
			b.add(it, hashItem(it), false)
		} else {
			a.add(it, hashItem(it), false)
		}
	}
	bound := (a.total + b.total) / k
	for _, h := range merged(a, b, 1000) {
		tr := exact[h.Item]
		if tr+h.Error < h.Count || h.Count+h.Error < tr {
			t.Errorf("%v: count %d error %d, true %d", h.Item, h.Count, h.Error, tr)
		}
		if h.Error > bound+2 { // two floors of N/k
			t.Errorf("%v: error %d > %d", h.Item, h.Error, bound)
		}
	}
	top := merged(a, b, 3)
	if len(top) != 3 || top[0].Key != "0" || top[0].Count < top[1].Count || top[1].Count < top[2].Count {
		t.Errorf("top 3: %+v", top)
	}
}

var (
	perIP  = sluice.MustLimit(sluice.Spec{Name: "per-ip", TokensPerSecond: 10, Burst: 20})
	login  = sluice.MustLimit(sluice.Spec{Name: "login", TokensPerSecond: 1, Burst: 5})
	ruleIP = &policy.Rule{Name: "per-ip", Limit: perIP}
	ruleLg = &policy.Rule{Name: "login", Limit: login}
)

func result(rule *policy.Rule, key string, rejected bool) policy.Result {
	r := policy.Result{Match: policy.Match{Rule: rule, Request: sluice.Request{Limit: rule.Limit, Key: key}}}
	r.Decision.Allowed = !rejected
	if rejected {
		r.Decision.RetryAfter = time.Second
		r.Violated = true
	}
	return r
}

// TestSeriesPerSecond counts decisions in the seconds they were made and
// shows the last Window complete seconds.
func TestSeriesPerSecond(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	c := New(Options{Clock: clk})
	for sec := range 3 {
		for range sec + 1 {
			c.ObserveResults([]policy.Result{result(ruleIP, "a", false), result(ruleLg, "a", sec == 2)})
		}
		clk.Advance(time.Second)
	}
	c.Observe("per-ip", "store_error")
	s := c.Snapshot(10)
	if s.From != 1_700_000_003-Window {
		t.Fatalf("from %d", s.From)
	}
	ip := s.Rules["per-ip"]
	if got := ip.Allowed[Window-3:]; fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("per-ip allowed, last 3 s: %v", got)
	}
	if ip.Rejected != nil || ip.StoreError != nil {
		t.Errorf("per-ip: rejected %v, store errors in the second in progress %v", ip.Rejected, ip.StoreError)
	}
	if got := s.Rules["login"].Rejected[Window-3:]; fmt.Sprint(got) != "[0 0 3]" {
		t.Errorf("login rejected: %v", got)
	}
	clk.Advance(time.Second)
	if got := c.Snapshot(10).Rules["per-ip"].StoreError[Window-1]; got != 1 {
		t.Errorf("store errors: %d", got)
	}

	// Past the window, a second's slot is reused and nothing old shows.
	clk.Advance(Window * time.Second)
	c.ObserveResults([]policy.Result{result(ruleIP, "a", false)})
	clk.Advance(time.Second)
	s = c.Snapshot(10)
	var sum uint64
	for _, v := range s.Rules["per-ip"].Allowed {
		sum += v
	}
	if sum != 1 {
		t.Errorf("per-ip allowed over the window: %d, want 1", sum)
	}
	if _, ok := s.Rules["login"]; ok {
		t.Errorf("login, idle for a window, still listed")
	}
	if _, ok := (*c.rules.Load())["login"]; ok {
		t.Errorf("login's series kept after a window idle")
	}
}

// TestRankings ranks by rejections and by traffic, over the current
// period and the one before, and forgets older ones.
func TestRankings(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	c := New(Options{Clock: clk, Counters: 8})
	for i := range 50 {
		c.ObserveResults([]policy.Result{result(ruleIP, "busy", false)})
		c.ObserveResults([]policy.Result{result(ruleLg, "attacker", i >= 5)})
		c.ObserveResults([]policy.Result{result(ruleIP, fmt.Sprint("once-", i), false)})
	}
	s := c.Snapshot(2)
	if len(s.ByTraffic.Keys) != 2 || s.ByTraffic.Total != 150 || s.ByTraffic.Counters != 8 || s.ByTraffic.Bound > 150/8 {
		t.Fatalf("by traffic: %+v", s.ByTraffic)
	}
	for _, h := range s.ByTraffic.Keys {
		if (h.Key != "busy" && h.Key != "attacker") || h.Count-h.Error > 50 || h.Count < 50 {
			t.Errorf("by traffic: %+v", h)
		}
	}
	if k := s.ByRejected.Keys; len(k) != 1 || k[0].Item != (Item{"login", "attacker"}) || k[0].Count != 45 || k[0].Error != 0 {
		t.Errorf("by rejections: %+v", s.ByRejected)
	}
	clk.Advance(time.Minute)
	if k := c.Snapshot(2).ByRejected.Keys; len(k) != 1 || k[0].Count != 45 {
		t.Errorf("the period before is shown: %+v", k)
	}
	clk.Advance(time.Minute)
	if s := c.Snapshot(2); len(s.ByRejected.Keys) != 0 || s.ByTraffic.Total != 0 {
		t.Errorf("two periods later: %+v", s.ByRejected)
	}
}

// Decisions wait in a shard's queue until a batch is full (see batch);
// a new period counts the ones queued in the period they were made, so
// that decisions two periods old are forgotten, not counted in the new
// one.
func TestQueuedDecisionsCountInTheirPeriod(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	c := New(Options{Clock: clk, Counters: 8})
	for range 5 {
		c.ObserveResults([]policy.Result{result(ruleIP, "old", true)})
	}
	clk.Advance(2 * time.Minute)
	c.ObserveResults([]policy.Result{result(ruleIP, "old", false)})
	s := c.Snapshot(2)
	if k := s.ByTraffic.Keys; s.ByTraffic.Total != 1 || len(k) != 1 || k[0].Count != 1 {
		t.Errorf("by traffic two periods on: %+v, want the one decision since", s.ByTraffic)
	}
	if k := s.ByRejected.Keys; len(k) != 0 {
		t.Errorf("by rejections two periods on: %+v, want none", k)
	}
}

// TestObserveAllocatesNothing: the decision path pays no allocation for
// the statistics while the rankings hold its key, and one at most, the
// key's copy, while a flood of fresh keys churns them.
func TestObserveAllocatesNothing(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0)) // no new period meanwhile
	for _, tc := range []struct {
		keys, counters int
		most           float64
	}{
		{16, 64, 0}, // every key held: a shard holds at most 16
		{1000, 16, 1},
	} {
		c := New(Options{Clock: clk, Counters: tc.counters})
		keys := make([]policy.Result, tc.keys)
		for i := range keys {
			keys[i] = result(ruleIP, fmt.Sprint("client-", i), i%3 == 0)
		}
		one := make([]policy.Result, 1)
		i := 0
		observe := func() {
			one[0] = keys[i%len(keys)]
			i++
			c.ObserveResults(one)
		}
		for range 5000 { // warm: the rule's series, the maps' room
			observe()
		}
		if n := testing.AllocsPerRun(5000, observe); n > tc.most {
			t.Errorf("%d keys in %d counters: ObserveResults allocates %v per call, want at most %v", tc.keys, tc.counters, n, tc.most)
		}
		c.StoreCall("take", time.Millisecond, false)
		if n := testing.AllocsPerRun(1000, func() { c.StoreCall("take", time.Millisecond, true) }); n != 0 {
			t.Errorf("StoreCall allocates %v per call", n)
		}
	}
}

// TestSecondsWithoutClock: the hot path's second is the system clock's.
func TestSecondsWithoutClock(t *testing.T) {
	var s seconds
	before := time.Now().Unix()
	got := s.get()
	again := s.get()
	after := time.Now().Unix()
	if got < before || again < got || again > after+1 {
		t.Errorf("seconds %d, %d outside [%d, %d]", got, again, before, after)
	}
}

// TestStoreAndPolicy records store calls and policy loads.
func TestStoreAndPolicy(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	c := New(Options{Clock: clk, Store: "memory://", Readings: func(names ...string) map[string]float64 {
		return map[string]float64{"sluice_live_keys": float64(len(names))}
	}})
	c.StoreCall("take", time.Millisecond, false)
	c.StoreCall("take", 3*time.Millisecond, true)
	c.Loaded("p.yaml", []byte("rules: []"), false, nil)
	c.PolicyInForce()
	clk.Advance(time.Second)
	c.Loaded("p.yaml", []byte("rules: ["), true, errors.New("p.yaml:1: bad"))
	s := c.Snapshot(5)
	last := Window - 1
	if s.Store.Calls[last] != 2 || s.Store.Errors[last] != 1 || s.Store.MeanMs[last] != 2 || s.Store.MaxMs[last] != 3 {
		t.Errorf("store: %d calls %d errors mean %v max %v", s.Store.Calls[last], s.Store.Errors[last], s.Store.MeanMs[last], s.Store.MaxMs[last])
	}
	if s.Readings["sluice_live_keys"] != float64(len(Readings)) || s.StoreURL != "memory://" {
		t.Errorf("readings %v, store %q", s.Readings, s.StoreURL)
	}
	p := s.Policy
	if p.Source != "p.yaml" || p.Version != version([]byte("rules: []")) || p.Changes != 1 || p.LastReload == nil || p.LastReload.OK || p.LastReload.Error != "p.yaml:1: bad" || p.LastReload.Version == p.Version {
		t.Errorf("policy: %+v %+v", p, p.LastReload)
	}
}

// checkStreamSummary checks the lists of s: buckets in strictly
// increasing count from the head, every counter in use in exactly one
// non-empty bucket that names it, and every bucket either linked or free.
func checkStreamSummary(t *testing.T, s *spaceSaving) {
	t.Helper()
	seen := map[int32]bool{}
	buckets, last, prev := 0, uint64(0), int32(none)
	for b := s.head; b != none; b = s.bnext[b] {
		buckets++
		if s.bprev[b] != prev || (prev != none && s.bcount[b] <= last) || s.bfirst[b] == none {
			t.Fatalf("bucket %d: prev %d (want %d), count %d after %d, first %d", b, s.bprev[b], prev, s.bcount[b], last, s.bfirst[b])
		}
		sp := int32(none)
		for sl := s.bfirst[b]; sl != none; sl = s.snext[sl] {
			if s.bucket[sl] != b || s.sprev[sl] != sp || seen[sl] {
				t.Fatalf("slot %d in bucket %d: names %d, prev %d (want %d), seen %v", sl, b, s.bucket[sl], s.sprev[sl], sp, seen[sl])
			}
			seen[sl], sp = true, sl
		}
		last, prev = s.bcount[b], b
	}
	free := 0
	for b := s.free; b != none; b = s.bnext[b] {
		free++
	}
	if len(seen) != s.n || buckets+free != s.k {
		t.Fatalf("%d slots in buckets of %d in use; %d buckets linked and %d free of %d", len(seen), s.n, buckets, free, s.k)
	}
}

// Attack: a flood of fresh keys (one per request, as a client minting
// addresses or user ids does) to grow the statistics without bound. The
// rankings keep Counters counters each, however many keys arrive, and the
// flooder's keys do not push out a key seen more than N/k times.
func TestAttackKeyFloodBounded(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	c := New(Options{Clock: clk, Counters: 32})
	one := make([]policy.Result, 1)
	for i := range 200_000 {
		if i%10 == 0 {
			one[0] = result(ruleLg, "real-attacker", true)
		} else {
			one[0] = result(ruleIP, "flood-"+strconv.Itoa(i), true)
		}
		c.ObserveResults(one)
		if i%50_000 == 0 {
			clk.Advance(30 * time.Second) // across ranking periods
		}
	}
	for i := range c.shards {
		for _, r := range [][2]*spaceSaving{c.shards[i].traffic, c.shards[i].rejected} {
			for _, s := range r {
				if s.n > 32 || len(s.slots) > 32 || len(s.bcount) > 32 || len(s.table) > 64 {
					t.Errorf("a ranking holds %d counters in %d, %d buckets, a table of %d; want at most 32 and 64", s.n, len(s.slots), len(s.bcount), len(s.table))
				}
			}
		}
	}
	if n := len(*c.rules.Load()); n != 2 {
		t.Errorf("%d rule series for 2 rules", n)
	}
	top := c.Snapshot(1).ByRejected
	if len(top.Keys) != 1 || top.Keys[0].Key != "real-attacker" {
		t.Errorf("the flood hid the real attacker: %+v", top)
	}
}

// Attack: long request lines under fresh keys. A key read from a query
// parameter is a piece of the request line (or of forward auth's header
// naming the original URI), which a client may make as long as
// max_header_bytes (64 KiB by default); a counter that kept
// the key as it came kept the whole line, so a client sending fresh keys
// with padded queries had each of the rankings' thousands of counters
// hold 64 KiB: 8 shards x 4 summaries x 256 counters, half a gigabyte,
// in statistics documented at a few megabytes. The rankings keep a copy
// of each key instead, its own size.
func TestAttackLongRequestLinesHeldByRankings(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(`rules:
  - name: per-key
    limit_keys: ["query:api_key"]
    algorithm_config: {rps: 1, burst: 5}
`))
	if err != nil {
		t.Fatal(err)
	}
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	const counters = 64
	c := New(Options{Clock: clk, Counters: counters})
	pad := strings.Repeat("x", 64<<10)
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	one := make([]policy.Result, 1)
	for i := range 3000 {
		if i == 1500 {
			clk.Advance(time.Minute) // both periods held
		}
		// As net/http makes it: the query, a piece of one string of the
		// request line.
		line := "GET /v1/items?api_key=k" + strconv.Itoa(i) + "&pad=" + pad + " HTTP/1.1"
		q := line[strings.IndexByte(line, '?')+1 : strings.LastIndexByte(line, ' ')]
		ms, err := p.Match(&policy.Input{Method: "GET", Path: "/v1/items", RawQuery: q})
		if err != nil || len(ms) != 1 || ms[0].Request.Key != "k"+strconv.Itoa(i) {
			t.Fatalf("match: %v %+v", err, ms)
		}
		one[0] = policy.Result{Match: ms[0]}
		one[0].Decision.Allowed = i%2 == 0
		one[0].Violated = i%2 != 0
		c.ObserveResults(one)
	}
	grew := int64(heap()) - int64(before)
	// The counters' own memory, and each shard's queue of decisions not
	// yet counted, still holding their lines (8 x 63 x 64 KiB at most),
	// where the counters held every line they had counted, too.
	if most := int64(nShards*(batch-1)*(64<<10) + 8<<20); grew > most {
		t.Errorf("the statistics hold %d MiB after 3000 requests of 64 KiB; want at most %d MiB", grew>>20, most>>20)
	}
	runtime.KeepAlive(c)
}
