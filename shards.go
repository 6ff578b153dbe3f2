package sluice

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/engine"
)

// shardSet is what a sharded Limit keeps to expand its requests.
type shardSet struct {
	n int
	// lim is one shard: the limit's parameters divided by n.
	lim *Limit
	// tags are the key prefixes of the shards, "{tag}" with a Redis
	// Cluster hash tag chosen so that shard i lands in its own slot.
	tags []string
}

// initShards validates l.spec.Shards and, above one, compiles the shards.
func (l *Limit) initShards() error {
	n := l.spec.Shards
	switch {
	case n < 0:
		return fmt.Errorf("shards must be >= 1 (got %d)", n)
	case n <= 1:
		return nil
	case n > MaxShards:
		return fmt.Errorf("shards must be at most %d (got %d)", MaxShards, n)
	case l.params.Algorithm == engine.LeakyBucket:
		return errors.New("shards do not apply to a leaky bucket: shaping needs one queue")
	case strings.ContainsAny(l.spec.Name, "{}"):
		return fmt.Errorf("a sharded limit's name may not contain '{' or '}': they would decide its Redis Cluster slot")
	}
	sp, err := shardParams(l.params, int64(n))
	if err != nil {
		return err
	}
	sp.Precompute()
	shard := &Limit{spec: l.spec, params: sp, nameID: l.nameID}
	shard.spec.Shards = 0
	shard.setPlain()
	l.shards = &shardSet{n: n, lim: shard, tags: shardTags(l.spec.Name, n)}
	return nil
}

// shardParams divides p among n shards, rounding every share down so that
// the shards together never allow more than p.
func shardParams(p engine.Params, n int64) (engine.Params, error) {
	s := p
	s.Capacity = p.Capacity / n
	s.MaxReserved = p.MaxReserved / n
	if s.Capacity < 1 {
		return s, fmt.Errorf("capacity %v over %d shards is below one micro-token each", engine.FromMicroTokens(p.Capacity), n)
	}
	switch p.Algorithm {
	case engine.TokenBucket:
		g := gcd(p.RateNum, n)
		s.RateNum, s.RateDen = p.RateNum/g, p.RateDen*(n/g)
		if s.RateDen > engine.MaxRateDen {
			// Round the share down to the finest rate the engines keep.
			s.RateNum, s.RateDen = engine.MulDiv(p.RateNum, engine.MaxRateDen, p.RateDen*n), engine.MaxRateDen
			g := gcd(s.RateNum, s.RateDen)
			s.RateNum, s.RateDen = s.RateNum/g, s.RateDen/g
		}
		if s.RateNum < 1 {
			return s, fmt.Errorf("the rate over %d shards is below what a shard can count", n)
		}
		if hi := float64(s.Capacity+s.MaxReserved) * float64(s.RateDen); hi >= engine.MaxScaled {
			return s, fmt.Errorf("capacity over %d shards at this rate's precision overflows; give the rate as rate + period with whole numbers", n)
		}
	case engine.FixedWindow, engine.SlidingLog:
		s.WindowRate = p.WindowRate / n
		if s.WindowRate < 1 {
			return s, fmt.Errorf("rate %v over %d shards is below one micro-token each", engine.FromMicroTokens(p.WindowRate), n)
		}
		if windows := float64(s.Capacity/s.WindowRate + 1); windows*float64(s.Period) >= engine.MaxScaled {
			return s, fmt.Errorf("refilling a shard's capacity over %d shards takes too long to express", n)
		}
	}
	return s, nil
}

// Shards returns the number of shards the limit is kept in (1 when it is
// not sharded).
//
// A hot limit (one global bucket, or one key that takes hundreds of
// requests a second) puts every request on one key: one lock, one row, one
// Redis node. With Spec.Shards = N the limit is kept in N buckets instead,
// each with 1/N of the rate, capacity and max_reserved, under keys that
// land in N different Redis Cluster hash slots spread over the slot range
// (so over the nodes). A request samples two shards at random and reads
// both ("the power of two choices"), then is charged:
//
//   - to the fuller shard alone, when it holds the cost;
//   - else to both, when only together they hold it: an all-or-nothing
//     take of the two with the cost split so that both are left with
//     the same tokens (a cost above capacity/N can only be served so);
//   - else, with a reservation, to the fuller shard alone, on credit
//     (a reservation is never split);
//   - else it is rejected, and told the wait until the two together
//     would hold it.
//
// The shards' sum never exceeds the unsharded limit (each shard's share is
// rounded down), and every shard's bucket is charged atomically by the
// store, so sharding adds nothing to the bound: over any interval
// [t1, t2] a sharded token bucket admits at most capacity + max_reserved +
// rate*(t2-t1), a sharded fixed window at most its capacity per window
// (its shards keep the unsharded key's windows) and a sharded sliding log
// at most its capacity in any period. Reservations are the exception,
// counted at their turns: each shard promises max(capacity/N, largest
// cost) + rate/N*dt for the turns in an interval of length dt, and the
// shards' turns may coincide, so together up to N*max(capacity/N,
// largest cost) + rate*dt where one bucket promises max(capacity,
// largest cost) + rate*dt. What it costs is admission: a
// request sees two shards, not the whole limit, so it may be rejected
// while other shards hold tokens, and one shard admits bursts of at most
// capacity/N (2*capacity/N for a request split over two).
//
// The read and the charge are two store calls: two callers may read the
// same shard and both charge it, or a charge may find a shard emptied
// since it was read. That only affects balance, never the bound: the store
// decides each charge atomically against the shard's real state, and a
// request that was rejected only because of such a race is tried once
// more on a fresh pair.
func (l *Limit) Shards() int {
	if l.shards == nil {
		return 1
	}
	return l.shards.n
}

// ShardKey returns the key under which shard i (0 <= i < Shards()) of key
// is kept: its StorageKey is l.StorageKey(l.ShardKey(key, i)). Every key
// of a sharded limit is prefixed so, so no request key can name a shard
// of another (a key is its shard's suffix, whole). The prefix is a Redis
// Cluster hash tag that decides the slot, in place of any hash tag in key.
// An unsharded limit keeps key as it is.
func (l *Limit) ShardKey(key string, i int) string {
	if l.shards == nil || i < 0 || i >= l.shards.n {
		return key
	}
	return l.shards.tags[i] + key
}

// MaxCost returns the largest cost a take may ask without a reservation:
// the capacity, or for a sharded limit what two shards hold together,
// 2*capacity/shards (rounded down to micro-tokens per shard).
func (l *Limit) MaxCost() float64 {
	if l.shards == nil {
		return l.Capacity()
	}
	return engine.FromMicroTokens(2 * l.shards.lim.params.Capacity)
}

// shardCost is Limit.cost for a sharded limit's takes and peeks: a cost
// above what two shards hold together can never succeed.
func (l *Limit) shardCost(cost float64) (int64, error) {
	most := 2 * l.shards.lim.params.Capacity
	c, err := engine.ToMicroTokens(cost)
	if c = l.logEntry(c); err == nil && c <= most {
		return c, nil
	}
	if err != nil && !(cost > engine.FromMicroTokens(most)) {
		return 0, costInvalid(l.spec.Name, cost)
	}
	return 0, costAbove(l.spec.Name, cost, fmt.Sprintf("what two of its %d shards hold together (%v: 2 x capacity %v / %d)",
		l.shards.n, engine.FromMicroTokens(most), l.Capacity(), l.shards.n))
}

// shardRequest is r's request to shard i of its limit, for cost
// micro-tokens.
func (r Request) shardRequest(i int, cost int64, reserve bool) Request {
	ss := r.Limit.shards
	sr := Request{Limit: ss.lim, Key: ss.tags[i] + r.Key, Cost: engine.FromMicroTokens(cost), Reserve: reserve}
	if p := &ss.lim.params; p.Algorithm == engine.FixedWindow && p.Offset < 0 {
		// The shards count in the windows of the unsharded key: each is
		// a copy whose start is that key's offset.
		cp := *ss.lim
		cp.params.Offset = engine.WindowOffset(r.Key, p.Period)
		sr.Limit = &cp
	}
	if r.MaxReserved != 0 {
		sr.MaxReserved = r.MaxReserved / float64(ss.n)
	}
	return sr
}

// shardJudge is Request.Charged's rule for a sharded limit's take or peek:
// the cost, and whether a reservation can be taken from one shard. A
// reservation is taken from one shard, so it is bounded by what one
// shard may reserve; a cost above that (or a request without Reserve)
// is bounded by what two shards hold together.
func (r Request) shardJudge(op engine.Op) (cost int64, reservable bool, err error) {
	c := r.costOrOne()
	cost, err = r.Limit.shardCost(c)
	if !r.Reserve {
		return cost, false, err
	}
	sr := r.shardRequest(0, 0, true)
	sr.Cost = c
	_, serr := sr.charge(op)
	switch {
	case serr == nil:
		if err != nil { // beyond two shards' tokens, within one shard's credit
			cost, err = engine.ToMicroTokens(c)
		}
		return cost, true, err
	case errors.Is(serr, ErrCostExceedsLimit):
		// No shard can reserve it; two shards' tokens may still serve it.
		return cost, false, err
	}
	return 0, false, serr // no reservations on this algorithm, or a bad max_reserved
}

// shardedCharge is Request.Charged's charge for a sharded limit (see shardJudge).
func (r Request) shardedCharge(op engine.Op) (engine.Charge, error) {
	if op == engine.OpRefund {
		c, err := r.Limit.cost(op, r.costOrOne(), r.Limit.params.Capacity+r.Limit.params.MaxReserved, false)
		return engine.Charge{Cost: c}, err
	}
	c, _, err := r.shardJudge(op)
	if err != nil {
		return engine.Charge{}, err
	}
	ch := engine.Charge{Cost: c, Reserve: r.Reserve, MaxReserved: r.Limit.params.MaxReserved}
	if r.MaxReserved != 0 {
		if ch.MaxReserved, err = engine.ToMicroTokens(r.MaxReserved); err != nil {
			return engine.Charge{}, fmt.Errorf("limit %q: max_reserved: %w", r.Limit.Name(), err)
		}
	}
	return ch, nil
}

func (r Request) costOrOne() float64 { return cmp.Or(r.Cost, 1) }

// Slot tags.

// clusterSlots is the number of Redis Cluster hash slots.
const clusterSlots = 16384

// crc16 is the CRC-16/XMODEM that Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// slotTags maps every Cluster slot to the smallest number whose decimal
// form hashes to it: a hash tag "{n}" puts a key in that slot. Built on
// first use (about 110,000 hashes), for sharded limits only.
var slotTags = sync.OnceValue(func() *[clusterSlots]uint32 {
	var t [clusterSlots]uint32
	var seen [clusterSlots]bool
	left := clusterSlots
	var buf []byte
	for n := uint32(0); left > 0; n++ {
		buf = strconv.AppendUint(buf[:0], uint64(n), 10)
		s := crc16(string(buf)) % clusterSlots
		if !seen[s] {
			seen[s], t[s] = true, n
			left--
		}
	}
	return &t
})

// shardTags returns the key prefixes of n shards of the limit called
// name: hash tags of n slots spread evenly over the slot range from one
// that the name picks, so that on a Cluster whose nodes hold even ranges
// of slots the shards fall on as many nodes as they can. Every process
// computes the same tags: they are part of the keys.
func shardTags(name string, n int) []string {
	tags := make([]string, n)
	base := int(crc16(name) % clusterSlots)
	t := slotTags()
	for i := range tags {
		slot := (base + i*clusterSlots/n) % clusterSlots
		tags[i] = "{" + strconv.FormatUint(uint64(t[slot]), 10) + "}"
	}
	return tags
}

// The limiter's side.

// WithShardSeed returns a copy of l whose choice of shards is a fixed
// sequence drawn from seed, so that a run can be repeated (simulations,
// tests). The copy shares l's store. A Limiter from New draws from the
// process's random source.
func (l *Limiter) WithShardSeed(seed uint64) *Limiter {
	c := *l
	c.rng = &lockedRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	return &c
}

type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *Limiter) intN(n int) int {
	if l.rng == nil {
		return rand.IntN(n)
	}
	l.rng.mu.Lock()
	defer l.rng.mu.Unlock()
	return l.rng.r.IntN(n)
}

// one decides r alone with op, expanding a sharded limit.
func (l *Limiter) one(ctx context.Context, op engine.Op, r Request) (Decision, error) {
	if r.Key == "" {
		return Decision{}, noKey(r.Limit)
	}
	c, err := r.Charged(op)
	if err != nil {
		return Decision{}, err
	}
	if r.Limit.shards == nil {
		return l.store.Take(ctx, op, c)
	}
	ds, err := l.sharded(ctx, op, []Charged{c})
	if err != nil {
		return Decision{}, err
	}
	return ds[0], nil
}

// allCharged decides cs together with op, expanding sharded limits; the
// decisions are appended to dst when it is not nil and the store can.
func (l *Limiter) allCharged(ctx context.Context, op engine.Op, cs []Charged, dst []Decision) ([]Decision, error) {
	if slices.ContainsFunc(cs, func(c Charged) bool { return c.Limit.shards != nil }) {
		return l.sharded(ctx, op, cs)
	}
	return l.store.TakeAll(ctx, op, cs, dst)
}

// reset clears key under lim: every shard of a sharded limit.
func (l *Limiter) reset(ctx context.Context, lim *Limit, key string) error {
	if lim == nil || lim.shards == nil {
		return l.store.Reset(ctx, lim, key)
	}
	var errs []error
	for _, tag := range lim.shards.tags {
		if err := l.store.Reset(ctx, lim.shards.lim, tag+key); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// shardState is one shard as a probe read it: its micro-tokens (negative
// in debt) and the wait until it is full.
type shardState struct {
	tokens int64
	reset  time.Duration
}

// shardPart is one shard's share of a request.
type shardPart struct {
	shard   int
	cost    int64 // micro-tokens
	reserve bool
}

// expansion is one sharded request of a call, as it is being decided.
type expansion struct {
	req        int   // index in the caller's requests
	cost       int64 // micro-tokens
	reservable bool
	sampled    []int // shards read
	probes     []int // index of each sampled shard's probe
	parts      []shardPart
	first      int  // index of the first part among the store's requests
	admit      bool // the plan expects the take to be admitted
}

// sharded decides rs, some of whose limits are sharded: one store call
// reads the shards each request samples, then one call (all-or-nothing,
// as TakeAll always is) charges the unsharded requests and the shards'
// parts together. A take rejected only because a shard it expected to
// hold its share no longer did is decided once more on fresh shards.
func (l *Limiter) sharded(ctx context.Context, op engine.Op, rs []Charged) ([]Decision, error) {
	ds, raced, err := l.shardedOnce(ctx, op, rs)
	if err == nil && raced {
		ds, _, err = l.shardedOnce(ctx, op, rs)
	}
	return ds, err
}

func (l *Limiter) shardedOnce(ctx context.Context, op engine.Op, rs []Charged) ([]Decision, bool, error) {
	exps, probes, err := l.expandSharded(op, rs)
	if err != nil {
		return nil, false, err
	}
	states, err := l.probeShards(ctx, probes)
	if err != nil {
		return nil, false, err
	}
	final, err := planSharded(op, rs, exps, states)
	if err != nil {
		return nil, false, err
	}
	fds, err := l.takeFinal(ctx, op, final)
	if err != nil {
		return nil, false, err
	}
	out, raced := foldSharded(op, rs, exps, states, fds)
	return out, raced, nil
}

// expandSharded judges each sharded request of rs and picks the shards it
// samples (every shard for a peek not Sampled), returning the expansions
// in the caller's order and the probes that read the sampled shards.
func (l *Limiter) expandSharded(op engine.Op, rs []Charged) ([]expansion, []Charged, error) {
	exps := make([]expansion, 0, len(rs))
	var probes []Charged
	for i := range rs {
		if rs[i].Limit.shards == nil {
			continue
		}
		r := rs[i].request()
		e := expansion{req: i, cost: rs[i].Cost}
		if op != engine.OpRefund && r.Reserve {
			// The charge stands (Request.Charged judged it); whether one
			// shard can take it on credit is the shard's own judgement.
			_, e.reservable, _ = r.shardJudge(op)
		}
		n := r.Limit.shards.n
		if op == engine.OpPeek && !rs[i].sampled {
			e.sampled = make([]int, n)
			for s := range e.sampled {
				e.sampled[s] = s
			}
		} else {
			a := l.intN(n)
			e.sampled = []int{a, (a + 1 + l.intN(n-1)) % n}
		}
		full := r.Limit.shards.lim.params.Capacity
		e.probes = make([]int, len(e.sampled))
		for k, s := range e.sampled {
			// A shard that an earlier request of the call reads too is read
			// once: the store would otherwise see the same bucket twice.
			j := sameProbe(rs, exps, &rs[i], s)
			if j < 0 {
				j = len(probes)
				pc, err := r.shardRequest(s, full, false).Charged(engine.OpPeek)
				if err != nil {
					return nil, nil, fmt.Errorf("take %d of %d: shard %d: %w", i+1, len(rs), s, err)
				}
				probes = append(probes, pc)
			}
			e.probes[k] = j
		}
		exps = append(exps, e)
	}
	return exps, probes, nil
}

// probeShards reads the probed shards in one store call.
func (l *Limiter) probeShards(ctx context.Context, probes []Charged) ([]shardState, error) {
	pds, err := l.store.TakeAll(ctx, engine.OpPeek, probes, nil)
	if err != nil {
		return nil, err
	}
	// A probe asks for the whole shard, which only a full shard holds;
	// any other answers with its tokens and a positive wait. (The probes
	// go in one all-or-nothing call, so a full shard among short ones
	// reads as rejected, but with no wait of its own.)
	states := make([]shardState, len(probes))
	for j, d := range pds {
		states[j] = shardState{tokens: toMicro(d.Tokens), reset: d.ResetAfter}
		if d.Allowed || d.RetryAfter <= 0 {
			states[j] = shardState{tokens: probes[j].Limit.params.Capacity}
		}
	}
	return states, nil
}

// planSharded plans each sharded request on what the ones before it
// leave (recording the parts in its expansion), then lays out the store's
// requests in the caller's order.
func planSharded(op engine.Op, rs []Charged, exps []expansion, states []shardState) ([]Charged, error) {
	work := append([]shardState(nil), states...)
	var final []Charged
	ei := 0
	for i := range rs {
		if ei >= len(exps) || exps[ei].req != i {
			final = append(final, rs[i])
			continue
		}
		r := rs[i].request()
		e := &exps[ei]
		ei++
		cs := r.Limit.shards.lim.params.Capacity
		ts := make([]int64, len(e.sampled))
		for k, j := range e.probes {
			ts[k] = work[j].tokens
		}
		switch op {
		case engine.OpRefund:
			e.parts = planRefund(e.cost, cs, e.sampled, ts)
		case engine.OpPeek:
			a, b := fullestTwo(ts)
			e.parts, e.admit = planTake(e.cost, cs, e.sampled[a], e.sampled[b], ts[a], ts[b], e.reservable)
		default:
			e.parts, e.admit = planTake(e.cost, cs, e.sampled[0], e.sampled[1], ts[0], ts[1], e.reservable)
		}
		e.first = len(final)
		for _, p := range e.parts {
			pc, err := r.shardRequest(p.shard, p.cost, p.reserve).Charged(op)
			if err != nil {
				return nil, fmt.Errorf("take %d of %d: shard %d: %w", i+1, len(rs), p.shard, err)
			}
			final = append(final, pc)
			j := e.probes[slices.Index(e.sampled, p.shard)]
			if op == engine.OpRefund {
				work[j].tokens = min(cs, work[j].tokens+p.cost)
			} else {
				work[j].tokens -= p.cost
			}
		}
	}
	return final, nil
}

// takeFinal sends the planned requests in one store call (none for an
// empty plan).
func (l *Limiter) takeFinal(ctx context.Context, op engine.Op, final []Charged) ([]Decision, error) {
	switch len(final) {
	case 0:
		return nil, nil
	case 1:
		d, err := l.store.Take(ctx, op, final[0])
		if err != nil {
			return nil, err
		}
		return []Decision{d}, nil
	default:
		return l.store.TakeAll(ctx, op, final, nil)
	}
}

// foldSharded folds the store's decisions back into one per request of
// rs, and reports whether an admission the plan expected was refused by
// a shard that another caller drained meanwhile.
func foldSharded(op engine.Op, rs []Charged, exps []expansion, states []shardState, fds []Decision) ([]Decision, bool) {
	out := make([]Decision, len(rs))
	raced := false
	ei, fi := 0, 0
	for i, r := range rs {
		if ei >= len(exps) || exps[ei].req != i {
			out[i] = fds[fi]
			fi++
			continue
		}
		e := &exps[ei]
		ei++
		pds := fds[e.first : e.first+len(e.parts)]
		fi += len(e.parts)
		out[i] = foldShards(r.Limit, e, states, pds)
		if op == engine.OpTake && e.admit {
			raced = raced || slices.ContainsFunc(pds, func(d Decision) bool { return !d.Allowed && d.RetryAfter > 0 })
		}
	}
	return out, raced
}

// foldShards turns the decisions of a sharded request's parts into one
// decision of lim: allowed when every part is; the tokens (and the wait
// until full) of the shards it read, after its charge; the longest wait
// of its parts. A take reads two shards, so its tokens are those two
// shards'; a peek reads and sums them all.
func foldShards(lim *Limit, e *expansion, states []shardState, pds []Decision) Decision {
	o := engine.Outcome{Allowed: true}
	var reset, retry time.Duration
	for k, s := range e.sampled {
		if !slices.ContainsFunc(e.parts, func(p shardPart) bool { return p.shard == s }) {
			st := states[e.probes[k]]
			o.Tokens += st.tokens
			reset = max(reset, st.reset)
		}
	}
	for _, d := range pds {
		o.Allowed = o.Allowed && d.Allowed
		o.Tokens += toMicro(d.Tokens)
		reset = max(reset, d.ResetAfter)
		retry = max(retry, d.RetryAfter)
	}
	o.RetryAfter, o.ResetAfter = engine.Micros(retry), engine.Micros(reset)
	return lim.Decide(o)
}

// planTake decides how a take (or peek) of cost micro-tokens is spread
// over shards a and b, which hold ta and tb of a shard capacity of cs,
// and whether it is expected to be admitted:
//
//   - the fuller alone, when it holds the cost;
//   - both, when only together they hold it, split so that both are left
//     with the same tokens;
//   - the fuller alone on credit, when reservable;
//   - else a split that leaves both equally short (each part at most cs),
//     so that the store's waits are the wait until together they hold
//     it: the request is rejected, unless the shards refilled meanwhile.
func planTake(cost, cs int64, a, b int, ta, tb int64, reservable bool) ([]shardPart, bool) {
	if tb > ta {
		a, b, ta, tb = b, a, tb, ta
	}
	switch {
	case ta >= cost:
		return []shardPart{{shard: a, cost: cost}}, true
	case ta+tb >= cost:
		return splitCost(cost, cs, a, b, ta, tb), true
	case reservable:
		return []shardPart{{shard: a, cost: cost, reserve: true}}, false
	}
	return splitCost(cost, cs, a, b, ta, tb), false
}

// splitCost splits cost between a and b (ta >= tb) so that both are left
// with the same tokens, each part within [0, cs]; a part of zero is left
// out.
func splitCost(cost, cs int64, a, b int, ta, tb int64) []shardPart {
	ca := engine.FloorDiv(cost+ta-tb, 2)
	ca = min(max(ca, cost-cs), cs)
	switch {
	case ca >= cost:
		return []shardPart{{shard: a, cost: cost}}
	case ca <= 0:
		return []shardPart{{shard: b, cost: cost}}
	}
	return []shardPart{{shard: a, cost: ca}, {shard: b, cost: cost - ca}}
}

// planRefund gives amount back to the emptier of the sampled shards
// first, then to the other, each up to full; what both cannot hold is
// dropped, as a refund to a full bucket is.
func planRefund(amount, cs int64, sampled []int, ts []int64) []shardPart {
	e, o := 0, 1
	if ts[1] < ts[0] {
		e, o = 1, 0
	}
	var parts []shardPart
	for _, k := range []int{e, o} {
		give := min(amount, cs-ts[k], cs)
		if give > 0 {
			parts = append(parts, shardPart{shard: sampled[k], cost: give})
			amount -= give
		}
	}
	return parts
}

// fullestTwo returns the positions of the two largest of ts (ts has at
// least two), the earlier first on ties.
func fullestTwo(ts []int64) (int, int) {
	a, b := 0, 1
	if ts[b] > ts[a] {
		a, b = b, a
	}
	for k := 2; k < len(ts); k++ {
		switch {
		case ts[k] > ts[a]:
			a, b = k, a
		case ts[k] > ts[b]:
			b = k
		}
	}
	return a, b
}

// sameProbe returns the probe of shard s of r's limit and key that one
// of exps reads already, or -1.
func sameProbe(rs []Charged, exps []expansion, r *Charged, s int) int {
	for _, f := range exps {
		if o := rs[f.req]; o.Limit == r.Limit && o.Key == r.Key {
			if k := slices.Index(f.sampled, s); k >= 0 {
				return f.probes[k]
			}
		}
	}
	return -1
}

// toMicro converts a decision's tokens back to micro-tokens.
func toMicro(tokens float64) int64 { return int64(math.Round(tokens * engine.TokenScale)) }
