package quota

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/defaults"
)

// Options configure a Store.
type Options struct {
	// Clock is the local time slices are measured on; nil is the system
	// clock. Tests pass a sluice.ManualClock.
	Clock sluice.Clock
	// MaxKeys bounds the keys the Store follows, over every leased limit
	// (default DefaultMaxKeys): a key seen while the bound is reached is
	// decided exactly, so that a client making up keys never makes a
	// process hold more slices, or more memory, than this.
	MaxKeys int
	// ReturnTimeout bounds the store calls that return slices when
	// Configure changes the leased limits, and a request's takes and
	// returns of slices, which do not end with it (default 2s).
	ReturnTimeout time.Duration
}

// DefaultMaxKeys is Options.MaxKeys when it is zero.
const DefaultMaxKeys = 100_000

// Store is a sluice.Store that leases slices of the limits Configure
// names and passes everything else to the store it wraps (see the
// package doc). It is safe for concurrent use.
type Store struct {
	inner   sluice.Store
	outcome sluice.OutcomeStore // inner, when it is one
	clock   sluice.Clock
	maxKeys int64
	keys    atomic.Int64
	timeout time.Duration
	rules   atomic.Pointer[map[*sluice.Limit]*rule]
	cfg     sync.Mutex // one Configure at a time
}

// New returns a Store over inner leasing nothing until Configure.
func New(inner sluice.Store, opts Options) *Store {
	s := &Store{inner: inner, clock: opts.Clock, maxKeys: int64(opts.MaxKeys), timeout: opts.ReturnTimeout}
	s.outcome, _ = inner.(sluice.OutcomeStore)
	defaults.Set(&s.maxKeys, DefaultMaxKeys)
	defaults.Set(&s.timeout, 2*time.Second)
	return s
}

// Unwrap returns the store s wraps, for callers that look for a store
// beneath its wrappers.
func (s *Store) Unwrap() sluice.Store { return s.inner }

func (s *Store) now() time.Time {
	if s.clock != nil {
		return s.clock.Now()
	}
	return time.Now()
}

// Configure replaces the set of leased limits with set, atomically: a
// limit in set is leased under its Settings from the next request on, a
// limit not in it is decided exactly, and every slice of a limit that
// was leased before is returned to the store (or dropped, a fixed
// window's near its end). A limit that cannot be leased or Settings out
// of range are an error, and nothing changes.
func (s *Store) Configure(set map[*sluice.Limit]Settings) error {
	next := make(map[*sluice.Limit]*rule, len(set))
	for lim, st := range set {
		if err := Leasable(lim); err != nil {
			return err
		}
		if err := st.Validate(); err != nil {
			return fmt.Errorf("limit %q: lease: %w", lim.Name(), err)
		}
		next[lim] = newRule(lim, st)
	}
	s.cfg.Lock()
	defer s.cfg.Unlock()
	old := s.rules.Swap(&next)
	if old == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	for _, ru := range *old {
		s.closeRule(ctx, ru)
	}
	return nil
}

// Close returns every slice to the store (what a process does when it
// stops) and leases nothing from then on. The store s wraps stays open.
func (s *Store) Close(ctx context.Context) error {
	s.cfg.Lock()
	defer s.cfg.Unlock()
	return eachRule(ctx, s.rules.Swap(nil), s.closeRule)
}

// eachRule calls f on every rule of rules (none when nil), reporting the
// first failure.
func eachRule(ctx context.Context, rules *map[*sluice.Limit]*rule, f func(context.Context, *rule) error) error {
	if rules == nil {
		return nil
	}
	var first error
	for _, ru := range *rules {
		if err := f(ctx, ru); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Sweep ends the slices whose term or window is over, returning their
// unused tokens, and forgets the keys idle for two terms. sluice serve
// calls it periodically; requests end their own key's slice too.
func (s *Store) Sweep(ctx context.Context) error { return eachRule(ctx, s.rules.Load(), s.sweepRule) }

func (s *Store) sweepRule(ctx context.Context, ru *rule) error { return s.endSlices(ctx, ru, false) }

func (s *Store) closeRule(ctx context.Context, ru *rule) error { return s.endSlices(ctx, ru, true) }

// endSlices is a sweep of ru, or, closing, ends every slice and forgets
// every key; it returns what it can, reporting the first failure.
func (s *Store) endSlices(ctx context.Context, ru *rule, closing bool) error {
	now := s.now()
	ru.mu.Lock()
	ru.closed = ru.closed || closing
	backs := make(map[string]int64)
	for key, sl := range ru.keys {
		if sl.fetch != nil && !closing {
			continue
		}
		if closing || sl.tokens > 0 && !now.Before(sl.usableUntil()) {
			if back := ru.end(sl, now); back > 0 {
				backs[key] = back
			}
		}
		if closing || sl.tokens == 0 && now.Sub(sl.termStart) >= 2*ru.set.Term && !now.Before(sl.exactUntil) {
			delete(ru.keys, key)
			s.keys.Add(-1)
		}
	}
	ru.mu.Unlock()
	var first error
	for key, back := range backs {
		if err := s.giveBack(ctx, ru, key, back); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// returnLeft is giveBack for a request's path, under a context of its
// own: a client that hangs up must not make the process lose tokens the
// store charged (TestAttackHungUpRequestDropsSliceLeftovers).
func (s *Store) returnLeft(ctx context.Context, ru *rule, key string, back int64) {
	if back > 0 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		defer cancel()
		_ = s.giveBack(ctx, ru, key, back) // a failed refund is counted as dropped
	}
}

// giveBack refunds back micro-tokens of an ended slice to the store. A
// refund that fails leaves them taken: under-admission, counted as
// dropped.
func (s *Store) giveBack(ctx context.Context, ru *rule, key string, back int64) error {
	if back <= 0 {
		return nil
	}
	c, err := sluice.Request{Limit: ru.lim, Key: key, Cost: engine.FromMicroTokens(back)}.Charged(engine.OpRefund)
	if err == nil {
		_, err = s.inner.Take(ctx, engine.OpRefund, c)
	}
	if err != nil {
		ru.returned.Add(-1)
		ru.dropped.Add(1)
		return fmt.Errorf("quota: returning %v tokens of %q: %w", engine.FromMicroTokens(back), ru.lim.Name(), err)
	}
	return nil
}

// leased returns the rule leasing lim, or nil.
func (s *Store) leased(lim *sluice.Limit) *rule {
	rules := s.rules.Load()
	if rules == nil || lim == nil {
		return nil
	}
	return (*rules)[lim]
}

// Leased reports whether lim is leased, and under which Settings (with
// their defaults filled in).
func (s *Store) Leased(lim *sluice.Limit) (Settings, bool) {
	if ru := s.leased(lim); ru != nil {
		return ru.set, true
	}
	return Settings{}, false
}

// Take implements sluice.Store: a take of a leased limit is answered from
// the key's slice when it can be, everything else by the wrapped store.
func (s *Store) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	ru := s.leased(r.Limit)
	if ru != nil && op == engine.OpRefund {
		// Tokens come back: a refusal kept here may no longer hold.
		defer ru.forgetRefusal(r.Key)
	}
	if ru != nil && op == engine.OpTake {
		if cost, ok := leasedCost(r); ok {
			if a, ok, err := ru.local(ctx, s, r.Key, cost); ok || err != nil {
				return a.Decision, err
			}
			sent := s.now()
			d, err := s.inner.Take(ctx, op, r)
			if err == nil && !d.Allowed {
				ru.refused(r.Key, cost, sent, d)
			}
			return d, err
		}
	}
	return s.inner.Take(ctx, op, r)
}

// leasedCost is r's cost in micro-tokens when a slice may answer it: a
// take that does not reserve.
func leasedCost(r sluice.Charged) (int64, bool) { return r.Cost, !r.Reserve }

// TakeOutcome implements sluice.OutcomeStore: the wrapped store's when it
// is one and the limit is not leased, so that its fast path stays.
func (s *Store) TakeOutcome(ctx context.Context, lim *sluice.Limit, key string, ch engine.Charge) (engine.Outcome, time.Duration, error) {
	if s.outcome != nil && s.leased(lim) == nil {
		return s.outcome.TakeOutcome(ctx, lim, key, ch)
	}
	d, err := s.Take(ctx, engine.OpTake, sluice.Charged{Limit: lim, Key: key, Charge: ch})
	if err != nil {
		return engine.Outcome{}, -1, err
	}
	return engine.Outcome{
		Allowed:    d.Allowed,
		Tokens:     int64(math.Round(d.Tokens * engine.TokenScale)),
		RetryAfter: engine.Micros(d.RetryAfter),
		ResetAfter: engine.Micros(d.ResetAfter),
	}, -1, nil
}

// Epoch implements sluice.OutcomeStore: the wrapped store's, whose
// readings TakeOutcome passes on; zero when it is no OutcomeStore (then
// TakeOutcome answers no reading).
func (s *Store) Epoch() time.Time {
	if s.outcome != nil {
		return s.outcome.Epoch()
	}
	return time.Time{}
}

// TakeAll implements sluice.Store, all-or-nothing: when every leased
// member's slice holds its cost, those are charged locally and the rest
// go to the wrapped store; if it refuses them, the local tokens are put
// back. When a leased member's slice cannot answer, the whole batch goes
// to the wrapped store, exactly.
func (s *Store) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	rules := s.rules.Load()
	if op != engine.OpTake || rules == nil || len(*rules) == 0 {
		return s.inner.TakeAll(ctx, op, rs, dst)
	}
	var buf [4]held // the usual few rules of a request, without an allocation
	local := buf[:0]
	var rest []sluice.Charged
	for i, r := range rs {
		ru := (*rules)[r.Limit]
		if ru == nil {
			continue
		}
		cost, ok := leasedCost(r)
		if !ok {
			continue
		}
		d, ok, err := ru.local(ctx, s, r.Key, cost)
		if err != nil || !ok || !d.Allowed {
			s.putBack(local)
			if err != nil {
				return nil, err
			}
			return s.inner.TakeAll(ctx, op, rs, dst)
		}
		local = append(local, held{i: i, ru: ru, key: r.Key, cost: cost, gen: d.gen, d: d.Decision})
	}
	if len(local) == 0 {
		return s.inner.TakeAll(ctx, op, rs, dst)
	}
	if len(local) < len(rs) {
		rest = make([]sluice.Charged, 0, len(rs)-len(local))
		j := 0
		for i, r := range rs {
			if j < len(local) && local[j].i == i {
				j++
				continue
			}
			rest = append(rest, r)
		}
	}
	var ds []sluice.Decision
	if len(rest) > 0 {
		var err error
		if ds, err = s.inner.TakeAll(ctx, op, rest, nil); err != nil {
			s.putBack(local)
			return nil, err
		}
		if slices.ContainsFunc(ds, func(d sluice.Decision) bool { return !d.Allowed }) {
			s.putBack(local)
		}
	}
	out := dst[:0]
	j, k := 0, 0
	for i := range rs {
		if j < len(local) && local[j].i == i {
			out = append(out, local[j].d)
			j++
		} else {
			out = append(out, ds[k])
			k++
		}
	}
	return out, nil
}

// held is a TakeAll member charged to its slice.
type held struct {
	i    int
	ru   *rule
	key  string
	cost int64
	gen  uint64
	d    sluice.Decision
}

// putBack returns members charged to slices, to the slice they came
// from; a slice that has since ended keeps nothing (under-admission).
func (s *Store) putBack(hs []held) {
	for _, h := range hs {
		h.ru.putBack(h.key, h.cost, h.gen)
	}
}

// Reset implements sluice.Store: the key's slice is dropped, and the
// wrapped store refills the key.
func (s *Store) Reset(ctx context.Context, l *sluice.Limit, key string) error {
	if ru := s.leased(l); ru != nil {
		ru.drop(key)
	}
	return s.inner.Reset(ctx, l, key)
}

// Lease implements sluice.Store: concurrency limits are not leased here.
func (s *Store) Lease(ctx context.Context, op engine.Op, r sluice.Request, id engine.LeaseID) (sluice.Decision, error) {
	return s.inner.Lease(ctx, op, r, id)
}

// Supports implements sluice.Store: the wrapped store's answer.
func (s *Store) Supports(l *sluice.Limit) error { return s.inner.Supports(l) }

// RuleStats is what a Store reports of one leased limit.
type RuleStats struct {
	Rule     string
	MaxSlice float64 // tokens; zero: the limit is decided exactly
	Term     time.Duration
	HotAfter int
	// Taken, Returned and Dropped count slices: taken from the store,
	// returned to it with tokens left, ended with tokens that could not
	// go back (a fixed window's past its end, a failed refund).
	Taken, Returned, Dropped int64
	// Held is the tokens held now in this process's slices: what it may
	// still admit of the limit that the store has already counted, its
	// share of the overshoot at this moment.
	Held float64
	// Keys is the keys followed now.
	Keys int
}

// Stats reports every leased limit.
func (s *Store) Stats() []RuleStats {
	rules := s.rules.Load()
	if rules == nil {
		return nil
	}
	out := make([]RuleStats, 0, len(*rules))
	for _, ru := range *rules {
		ru.mu.Lock()
		n := len(ru.keys)
		ru.mu.Unlock()
		out = append(out, RuleStats{
			Rule: ru.lim.Name(), MaxSlice: engine.FromMicroTokens(ru.most), Term: ru.set.Term, HotAfter: ru.set.HotAfter,
			Taken: ru.taken.Load(), Returned: ru.returned.Load(), Dropped: ru.dropped.Load(),
			Held: engine.FromMicroTokens(ru.held.Load()), Keys: n,
		})
	}
	return out
}

// admitKey counts one more key followed, unless the bound is reached.
func (s *Store) admitKey() bool {
	if s.keys.Add(1) > s.maxKeys {
		s.keys.Add(-1)
		return false
	}
	return true
}
