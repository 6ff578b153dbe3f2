package memory

import (
	"context"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// Lease implements sluice.Store for concurrency limits. A key's leases
// are kept beside its table entry, as a sliding log's entries are, and
// decided by engine.StepLease under the shard's lock on the precise clock:
// a lease is held for a whole request, so its two calls are no hot path.
// The entry counts against MaxKeys like any other, and becomes full (free
// to evict, the same as absent) when its last lease ends; a key whose
// last lease is released is removed at once.
func (s *Store) Lease(_ context.Context, op engine.Op, r sluice.Request, id engine.LeaseID) (d sluice.Decision, err error) {
	if err := r.CheckLease(); err != nil {
		return d, err
	}
	lim := r.Limit
	p := lim.Params()
	h, check := s.hashes(lim, r.Key)
	sh := &s.shards[h&s.mask]
	var force bool
	for {
		now := s.preciseTime()
		sh.mu.Lock()
		i := sh.t.find(h, check)
		var st engine.State
		present := sh.load(i, p, &st)
		set, o, write := engine.StepLease(p, st.Leases, now, op, id)
		switch {
		case !write:
		case len(set) == 0:
			// Nothing held: the same as no state. An entry of another
			// shape under the same hashes is not this limit's to remove.
			if present {
				sh.seq.Add(1)
				sh.remove(i)
				sh.seq.Add(1)
			}
		default:
			if i < 0 {
				if need := s.room(sh, now, nil, force); need != roomMade {
					sh.mu.Unlock()
					force = !s.reclaim(now, need, sh.id, nil)
					continue
				}
			}
			if cap(set) > 64 && len(set) < cap(set)/4 {
				set = append([]engine.LeaseEntry(nil), set...) // give back what a busy moment grew
			}
			sh.store(i, h, check, &engine.State{Leases: set}, o, p, now)
		}
		sh.mu.Unlock()
		return lim.Decide(o), nil
	}
}

// storeLeases keeps the leases of (h, check) when p is a concurrency
// limit's, and forgets any otherwise (the name was a concurrency limit
// before). The shard's lock is held.
func (sh *shard) storeLeases(h, check uint64, p *engine.Params, leases []engine.LeaseEntry) {
	k := [2]uint64{h, check}
	switch {
	case p.Algorithm == engine.Concurrency:
		if sh.leases == nil {
			sh.leases = make(map[[2]uint64][]engine.LeaseEntry)
		}
		sh.leases[k] = leases
	case len(sh.leases) > 0:
		delete(sh.leases, k)
	}
}
