package memory

import (
	"context"
	"slices"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// TakeAll decides its requests with every shard involved locked, so that
// they are admitted together or not at all.

// work is one request of a TakeAll with its tentative state.
type work struct {
	h, check uint64
	shard    int
	present  bool
	st       engine.State
	same     int // index of an earlier request on the same bucket, or -1
}

// TakeAll implements sluice.Store: every bucket is decided on a scratch
// copy of its state while all the shards involved are locked; the copies
// are written back only if every request was admitted.
// The decisions are appended to dst, so that a caller deciding request
// after request (sluice.Limiter.AppendAll) allocates none.
func (s *Store) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	if len(rs) == 1 {
		// One limit (what a call of one descriptor or one rule asks):
		// Take's way, without the locks and the stack that several
		// buckets at once need. On the precise clock, as TakeAll always
		// is: the coarse one's ticker costs a server more than it saves
		// but at a very high rate of decisions (see clock.go).
		return append(dst, s.take(op, rs[0], true)), nil
	}
	return s.takeMany(op, rs, dst)
}

// takeMany is TakeAll of several requests. It is a function of its own so
// that TakeAll of one (the usual) does not reserve its buffers' stack: a
// goroutine whose stack the collector shrank between calls (a server's
// idle worker) would grow and copy it again for them.
func (s *Store) takeMany(op engine.Op, rs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	// Small requests (the usual three or four limits) work on the stack.
	var wsBuf [8]work
	var outBuf [8]engine.Outcome
	var idBuf [8]int
	ws, out := wsBuf[:0], outBuf[:0]
	if len(rs) > len(wsBuf) {
		ws, out = make([]work, 0, len(rs)), make([]engine.Outcome, 0, len(rs))
	}
	ws, out = ws[:len(rs)], out[:len(rs)]
	for i, r := range rs {
		h, check := s.hashes(r.Limit, r.Key)
		ws[i] = work{h: h, check: check, shard: int(h & s.mask), same: -1}
		for j := 0; j < i; j++ {
			if ws[j].h == h && ws[j].check == check {
				ws[i].same = j
			}
		}
	}
	locked := s.lockAll(ws, idBuf[:0])
	// One precise time for all: a coarse one would need a re-decision per
	// rejection, and TakeAll is not the path where one clock read matters.
	now := s.preciseTime()
	var force bool
	for {
		ds, all := s.decideAll(op, rs, ws, out, now, dst)
		if !all || op == engine.OpPeek {
			s.unlockAll(locked)
			return ds, nil
		}
		if need := s.roomAll(ws, locked, now, force); need != roomMade {
			// Another shard may hold a full key, or none of ours has one to
			// evict: free one there with no lock held, and decide again.
			s.unlockAll(locked)
			force = !s.reclaim(now, need, locked[0], ws)
			locked = s.lockAll(ws, locked[:0])
			continue
		}
		for i := range ws {
			if laterSame(ws, i) || !ws[i].present {
				continue // the last request on a bucket carries its final state; absent stays absent
			}
			w := &ws[i]
			sh := &s.shards[w.shard]
			sh.store(sh.t.find(w.h, w.check), w.h, w.check, &w.st, out[i], rs[i].Limit.Params(), now)
		}
		s.unlockAll(locked)
		return ds, nil
	}
}

// decideAll decides every request of a TakeAll on scratch copies of the
// buckets' states, under the shards' locks, and appends the decisions to
// dst.
func (s *Store) decideAll(op engine.Op, rs []sluice.Charged, ws []work, out []engine.Outcome, now int64, dst []sluice.Decision) ([]sluice.Decision, bool) {
	all := true
	for i := range ws {
		w := &ws[i]
		p := rs[i].Limit.Params()
		if w.same >= 0 { // the same bucket twice: continue from the earlier copy
			prev := &ws[w.same]
			w.present, w.st = prev.present, prev.st
		} else {
			sh := &s.shards[w.shard]
			w.st = engine.State{}
			w.present = sh.load(sh.t.find(w.h, w.check), p, &w.st)
			if w.st.Log != nil {
				// The log is decided on a copy: a rejection elsewhere must leave it as it was.
				w.st.Log = append([]engine.LogEntry(nil), w.st.Log...)
			}
		}
		var written bool
		if op == engine.OpRefund {
			out[i], written = engine.Refund(rs[i].Limit.Params(), &w.st, w.present, rs[i].Key, now, rs[i].Charge)
		} else {
			out[i], written = engine.Evaluate(rs[i].Limit.Params(), &w.st, w.present, rs[i].Key, now, rs[i].Charge, true)
		}
		w.present = w.present || written
		all = all && out[i].Allowed
	}
	n := len(dst)
	ds := slices.Grow(dst, len(rs))[:n+len(rs)]
	for i := range rs {
		if !all {
			out[i].Allowed = false
		}
		ds[n+i] = rs[i].Limit.Decide(out[i])
	}
	return ds, all
}

// roomAll reserves a key for each bucket of ws that the write-back will
// insert, evicting (never a key of ws) as room does. On failure it gives
// back what it reserved.
func (s *Store) roomAll(ws []work, locked []int, now int64, force bool) int {
	reserved := int64(0)
	for i := range ws {
		w := &ws[i]
		if laterSame(ws, i) || !w.present {
			continue
		}
		sh := &s.shards[w.shard]
		if sh.t.find(w.h, w.check) >= 0 {
			continue
		}
		if need := s.roomKeep(sh, now, locked, ws, force); need != roomMade {
			s.keys.Add(-reserved)
			return need
		}
		reserved++
	}
	return roomMade
}

func (s *Store) unlockAll(ids []int) {
	for _, id := range ids {
		s.shards[id].mu.Unlock()
	}
}

func laterSame(ws []work, i int) bool {
	for j := i + 1; j < len(ws); j++ {
		if ws[j].h == ws[i].h && ws[j].check == ws[i].check {
			return true
		}
	}
	return false
}

// lockAll locks the distinct shards of ws in ascending order, the one order
// every caller uses, and returns them.
func (s *Store) lockAll(ws []work, ids []int) []int {
	for _, w := range ws {
		dup := false
		for _, id := range ids {
			dup = dup || id == w.shard
		}
		if !dup {
			ids = append(ids, w.shard)
		}
	}
	for i := 1; i < len(ids); i++ { // insertion sort: a handful of ids
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	for _, id := range ids {
		s.shards[id].mu.Lock()
	}
	return ids
}
