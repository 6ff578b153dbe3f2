// Package insight keeps what sluice serve's live page (/ui) and
// /v1/stats show, in memory of a fixed size whatever the traffic and the
// number of keys:
//
//   - per rule, its decisions (allowed, rejected, shadow_rejected,
//     store_error) in each second of the last five minutes (Window);
//   - the hottest keys, by rejections and by traffic: Space-Saving
//     summaries over the current period (Options.Period, one minute) and
//     the one before, in 8 shards by a hash of the key (so that decisions
//     seldom wait on one lock), each of Options.Counters counters (256 by
//     default). A key's count is within N/k of its true count, where N is
//     the decisions the ranking counted over those periods and k the
//     counters of a shard, and every key seen more than N/k times is
//     listed (see Ranking);
//   - the store's calls, errors and latency per second (StoreCall, which
//     metrics.Metrics.OnStoreCall feeds), and readings of the gauges and
//     counters the stores export (breaker state, over-limit cache hits);
//   - the requests decided in each second (admitted, rejected), one per
//     Enforce call whatever the number of rules it matched;
//   - the policy's source, version and last reload.
//
// A Collector is a policy.ResultsObserver: policy.Enforce tells it every
// decision. It takes no clock reading per decision (see seconds), one
// short lock per call, and allocates nothing once it has seen each rule
// but a copy of a key new to the current period's rankings (see
// spaceSaving.add).
package insight

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/defaults"
	"github.com/sluicehq/sluice/policy"
)

// Options configures a Collector. The zero value works.
type Options struct {
	// Counters is the number of counters of each heavy-hitters ranking
	// (default 256): the memory it takes and the precision of its counts
	// (see Ranking).
	Counters int
	// Period is how long a ranking counts before it starts over (default
	// one minute); a ranking shows the current period and the one before.
	Period time.Duration
	// Clock, when set, is read for every decision (tests); by default the
	// system clock is read once a second (see seconds).
	Clock sluice.Clock
	// Store describes the store ("redis://10.0.0.5:6379", its password
	// hidden), for the page.
	Store string
	// Readings, when set, returns the values of the metrics named by
	// Readings' keys that exist (see metrics.Metrics.Values), for the
	// store's health.
	Readings func(names ...string) map[string]float64
}

// Collector gathers the statistics. It is safe for concurrent use. Its
// memory is fixed but for one series per rule that decided in the last
// Window: about 40 KiB per rule, and 8 shards of four summaries of
// Options.Counters counters (about 90 KiB a shard at 256, and a copy of
// each key counted) and a queue of 64 decisions (3 KiB, and the
// requests their keys are part of until they are counted).
type Collector struct {
	opts Options
	sec  seconds

	// rules maps a rule's name to its series; it is replaced, never
	// changed, so the hot path reads it without a lock.
	rules   atomic.Pointer[map[string]*ruleSeries]
	rulesMu sync.Mutex // serialises replacing rules

	// The rankings, in shards by a hash of the item, so that decisions
	// of different keys seldom wait on one lock.
	shards [nShards]rankings

	store storeSeries
	// requests counts whole requests: outAllowed for one admitted,
	// outRejected for one an enforce-mode rule refused.
	requests ruleSeries

	polMu  sync.Mutex
	pol    PolicyInfo
	starts time.Time
}

// New returns a Collector.
func New(opts Options) *Collector {
	defaults.Set(&opts.Counters, 256)
	if opts.Period < time.Second {
		opts.Period = time.Minute
	}
	c := &Collector{opts: opts, sec: seconds{clock: opts.Clock}}
	for i := range c.shards {
		for j := range 2 {
			c.shards[i].traffic[j] = newSpaceSaving(opts.Counters)
			c.shards[i].rejected[j] = newSpaceSaving(opts.Counters)
		}
	}
	c.rules.Store(&map[string]*ruleSeries{})
	c.starts = c.sec.wall()
	return c
}

// outcome maps policy.Result.Outcome's names to a rule's counters.
func outcome(s string) int {
	switch s {
	case "allowed":
		return outAllowed
	case "rejected":
		return outRejected
	case "shadow_rejected":
		return outShadowRejected
	case "not_charged":
		return outNotCharged
	}
	return outStoreError
}

// series returns rule's series, creating it on first sight.
func (c *Collector) series(rule string) *ruleSeries {
	if s := (*c.rules.Load())[rule]; s != nil {
		return s
	}
	c.rulesMu.Lock()
	defer c.rulesMu.Unlock()
	old := *c.rules.Load()
	if s := old[rule]; s != nil {
		return s
	}
	m := maps.Clone(old)
	s := &ruleSeries{}
	m[rule] = s
	c.rules.Store(&m)
	return s
}

// Observe counts one decision of rule without its key (the rankings do
// not see it). It implements policy.Observer; Enforce calls
// ObserveResults instead.
func (c *Collector) Observe(rule, result string) {
	c.series(rule).add(c.sec.get(), outcome(result))
}

// ObserveResults counts the decisions of one Enforce call. It implements
// policy.ResultsObserver.
func (c *Collector) ObserveResults(rs []policy.Result) {
	if len(rs) == 0 {
		return
	}
	sec := c.sec.get()
	refused := false
	for i := range rs {
		r := &rs[i]
		if r.Match.Rule != nil {
			c.series(r.Match.Rule.Name).add(sec, outcome(r.Outcome()))
		}
		// Verdict.Allowed's rule: an enforce-mode decision that did not
		// admit (a store error under on_store_error: deny included).
		refused = refused || (!r.Shadow && !r.Decision.Allowed)
	}
	if refused {
		c.requests.add(sec, outRejected)
	} else {
		c.requests.add(sec, outAllowed)
	}
	p := int64(c.opts.Period / time.Second)
	for i := range rs {
		r := &rs[i]
		lim := r.Match.Request.Limit
		if lim == nil {
			continue
		}
		it := Item{Limit: lim.Name(), Key: r.Match.Request.Key}
		h := hashItem(it)
		sh := &c.shards[h>>(64-shardBits)]
		sh.mu.Lock()
		sh.rotate(sec, p)
		sh.queue(it, h, r.Violated)
		sh.mu.Unlock()
	}
}

// shardBits picks a ranking shard from the top bits of an item's hash;
// the table inside a shard uses the low ones.
const (
	shardBits = 3
	nShards   = 1 << shardBits
)

// rankings is one shard of both rankings: the items whose hash falls in
// it, over the current period and the one before.
type rankings struct {
	mu       sync.Mutex
	period   int64 // the Unix second the current period started
	traffic  [2]*spaceSaving
	rejected [2]*spaceSaving // [0] the current period, [1] the one before
	// The decisions of the current period not yet counted (see queue).
	pending  [batch]decided
	npending int
	_        [64]byte // a cache line of its own for mu
}

// batch is how many decisions a shard queues before counting them. The
// summaries are tens of kilobytes per shard, touched at a dozen random
// places by a decision of a key they do not hold, and between two
// decisions a server's own work evicts them from the cache: counted one
// by one, nearly every touch was a miss. Counted a batch at a time, the
// places a batch touches are mostly in the cache already.
const batch = 64

// decided is one queued decision: its item, the item's hash, and
// whether it was rejected.
type decided struct {
	it       Item
	h        uint64
	rejected bool
}

// queue counts one decision, in the next batch. r.mu is held.
func (r *rankings) queue(it Item, h uint64, rejected bool) {
	r.pending[r.npending] = decided{it, h, rejected}
	if r.npending++; r.npending == batch {
		r.count()
	}
}

// count counts the queued decisions in the current period's summaries.
// r.mu is held.
func (r *rankings) count() {
	q := r.pending[:r.npending]
	for i := range q {
		// The traffic summary counts every decision, so it holds the
		// item from then on: its copy of the key serves both.
		it := r.traffic[0].add(q[i].it, q[i].h, false)
		if q[i].rejected {
			r.rejected[0].add(it, q[i].h, true)
		}
	}
	clear(q) // the keys' memory is the summaries' or no one's
	r.npending = 0
}

// rotate starts a new ranking period when the current one (p seconds)
// is over: periods start at multiples of p since the epoch. The queued
// decisions are counted first, in the period they were made in. r.mu is
// held.
func (r *rankings) rotate(sec, p int64) {
	start := sec - sec%p
	if start <= r.period {
		return
	}
	r.count()
	for _, rk := range []*[2]*spaceSaving{&r.traffic, &r.rejected} {
		rk[0], rk[1] = rk[1], rk[0]
		rk[0].reset()
		if start != r.period+p { // a whole period without decisions: nothing is recent
			rk[1].reset()
		}
	}
	r.period = start
}

// StoreCall counts one call to the store: how long it took and whether
// it failed. metrics.Metrics.OnStoreCall takes it.
func (c *Collector) StoreCall(op string, d time.Duration, failed bool) {
	c.store.add(c.sec.get(), d, failed)
}

// PolicyInfo is where the policy in force came from and how its last
// reload went.
type PolicyInfo struct {
	// Source is the file (or "embedded default").
	Source string
	// Version is the start of the SHA-256 of the file in force, in hex.
	Version string
	// LoadedAt is when the policy in force was installed (a reload, or a
	// change of the rules table).
	LoadedAt time.Time
	// Changes counts the policies installed since the start, the first
	// included.
	Changes int
	// LastReload is the last reload of the file, nil before the first.
	LastReload *Reload
}

// Reload is the outcome of one reload of the file.
type Reload struct {
	At time.Time
	OK bool
	// Error is why it was refused (the file's FILE:LINE problems).
	Error string
	// Version is the start of the SHA-256 of the file that was read.
	Version string
}

// version names content by the start of its SHA-256.
func version(content []byte) string {
	if content == nil {
		return ""
	}
	sum := sha256.Sum256(content)
	return hex.EncodeToString(sum[:6])
}

// Loaded records a load of the policy file from source with its content:
// the first at start (reload false), then every reload, err saying why it
// was refused (the policy in force stays).
func (c *Collector) Loaded(source string, content []byte, reload bool, err error) {
	c.polMu.Lock()
	defer c.polMu.Unlock()
	now := c.sec.wall()
	if reload {
		r := &Reload{At: now, OK: err == nil, Version: version(content)}
		if err != nil {
			r.Error = err.Error()
		}
		c.pol.LastReload = r
	}
	if err == nil {
		c.pol.Source, c.pol.Version = source, version(content)
	}
}

// PolicyInForce records that a new policy serves from now (a reload, or
// a change of the rules kept in PostgreSQL).
func (c *Collector) PolicyInForce() {
	c.polMu.Lock()
	defer c.polMu.Unlock()
	c.pol.LoadedAt = c.sec.wall()
	c.pol.Changes++
}

// Ranking is the hottest keys of one ranking, the largest count first.
// Each key's true count over the ranking's periods lies within
// [Count-Error, Count+Error], and Error is at most Bound, the largest of
// the shards' N/Counters, itself at most Total/Counters: a key whose true
// count exceeds Bound is always listed.
type Ranking struct {
	// Since is when the counted periods began.
	Since    time.Time
	Total    uint64
	Counters int
	Bound    uint64
	Keys     []HotKey
}

// RuleCounts is one rule's decisions per second over a Snapshot's
// window; a nil slice means none of that outcome.
type RuleCounts struct {
	Allowed, Rejected, ShadowRejected, StoreError []uint64
	// NotCharged counts the decisions where the rule had room but took
	// nothing, because another rule rejected the request.
	NotCharged []uint64
}

// RequestCounts is the requests decided in each second of a Snapshot's
// window.
type RequestCounts struct {
	Admitted, Rejected []uint64
}

// Snapshot is the statistics at one moment.
type Snapshot struct {
	// From is the Unix second of the series' first value; the last is
	// From+Window-1, the last second completed.
	From int64
	// Now is when the snapshot was taken.
	Now time.Time
	// Started is when the collector started.
	Started time.Time
	// Rules by rule name: the rules that decided anything in the window.
	Rules map[string]RuleCounts
	// Requests are the requests decided per second, each once whatever
	// the rules it matched: admitted, or rejected by an enforce-mode rule.
	Requests   RequestCounts
	ByRejected Ranking
	ByTraffic  Ranking
	Store      StoreSeries
	// StoreURL is Options.Store.
	StoreURL string
	// Readings are the store metrics that exist (see Readings).
	Readings map[string]float64
	Policy   PolicyInfo
}

// Readings names the metrics a snapshot reads through Options.Readings:
// what the stores export about their health.
var Readings = []string{
	"sluice_redis_breaker_state",
	"sluice_redis_breaker_opens_total",
	"sluice_redis_store_errors_total",
	"sluice_redis_overlimit_cache_hits_total",
	"sluice_live_keys",
	`sluice_memory_evictions_total{state="full"}`,
	`sluice_memory_evictions_total{state="partial"}`,
	"sluice_postgres_violations_dropped_total",
}

// Snapshot returns the statistics now, with at most top keys per ranking.
// Rules that decided nothing for a whole window are forgotten.
func (c *Collector) Snapshot(top int) Snapshot {
	now := c.sec.wall()
	sec := now.Unix()
	s := Snapshot{From: sec - Window, Now: now, Started: c.starts, Rules: map[string]RuleCounts{}, StoreURL: c.opts.Store}
	var idle []string
	for name, rs := range *c.rules.Load() {
		if rs.last.Load() < s.From {
			idle = append(idle, name)
			continue
		}
		var rc RuleCounts
		var some bool
		for o, dst := range []*[]uint64{&rc.Allowed, &rc.Rejected, &rc.ShadowRejected, &rc.StoreError, &rc.NotCharged} {
			if v, ok := rs.read(s.From, o); ok {
				*dst, some = v, true
			}
		}
		if some {
			s.Rules[name] = rc
		}
	}
	c.forget(idle, s.From)
	s.Requests.Admitted, _ = c.requests.read(s.From, outAllowed)
	s.Requests.Rejected, _ = c.requests.read(s.From, outRejected)
	p := int64(c.opts.Period / time.Second)
	since := time.Unix(sec-sec%p-p, 0) // the period before the current one
	var rejected, traffic [nShards][2]*spaceSaving
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		sh.rotate(sec, p)
		sh.count()
		rejected[i] = [2]*spaceSaving{sh.rejected[0].clone(), sh.rejected[1].clone()}
		traffic[i] = [2]*spaceSaving{sh.traffic[0].clone(), sh.traffic[1].clone()}
		sh.mu.Unlock()
	}
	s.ByRejected = ranking(rejected[:], top, since, c.opts.Counters)
	s.ByTraffic = ranking(traffic[:], top, since, c.opts.Counters)
	s.Store = c.store.read(s.From)
	if c.opts.Readings != nil {
		s.Readings = c.opts.Readings(Readings...)
	}
	c.polMu.Lock()
	s.Policy = c.pol
	if r := c.pol.LastReload; r != nil {
		cp := *r
		s.Policy.LastReload = &cp
	}
	c.polMu.Unlock()
	return s
}

// forget drops the series of rules idle since before from (a rule
// removed by a reload, a row of the rules table deleted), so that they
// do not accumulate. A decision of such a rule that races with forget
// may be counted in the dropped series: one decision after five idle
// minutes.
func (c *Collector) forget(names []string, from int64) {
	if len(names) == 0 {
		return
	}
	c.rulesMu.Lock()
	defer c.rulesMu.Unlock()
	old := *c.rules.Load()
	m := make(map[string]*ruleSeries, len(old))
	for k, v := range old {
		if v.last.Load() >= from || !slices.Contains(names, k) {
			m[k] = v
		}
	}
	c.rules.Store(&m)
}

// ranking ranks the shards' items: each shard's top, then the top of
// those (an item is in one shard only, so no counts are summed across
// shards, and the top n overall are among the shards' top n).
func ranking(shards [][2]*spaceSaving, top int, since time.Time, k int) Ranking {
	out := Ranking{Since: since, Counters: k, Keys: []HotKey{}}
	for _, r := range shards {
		n := r[0].total + r[1].total
		out.Total += n
		out.Bound = max(out.Bound, n/uint64(k))
		out.Keys = append(out.Keys, merged(r[0], r[1], top)...)
	}
	sortHot(out.Keys)
	out.Keys = out.Keys[:min(len(out.Keys), top)]
	return out
}
