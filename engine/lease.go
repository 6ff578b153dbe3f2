package engine

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
)

// ErrInvalidLease is a lease id that is not 32 hexadecimal digits.
var ErrInvalidLease = errors.New("sluice: a lease id is 32 hexadecimal digits")

// LeaseID names one held slot. It is drawn from crypto/rand (NewLeaseID)
// and is the only proof of holding the slot: whoever knows it can renew
// or release it, and 128 random bits cannot be guessed. It is meaningful
// only under the limit and key it was acquired for.
type LeaseID [16]byte

// NewLeaseID returns a random lease id, never the zero one.
func NewLeaseID() LeaseID {
	var id LeaseID
	for id == (LeaseID{}) {
		rand.Read(id[:]) // never fails (crypto/rand, Go 1.24 and later)
	}
	return id
}

// String returns id as 32 lowercase hexadecimal digits, the form the
// decision API and the stores use.
func (id LeaseID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is the zero id, which no lease has.
func (id LeaseID) IsZero() bool { return id == LeaseID{} }

// ParseLeaseID reads 32 hexadecimal digits (either case).
func ParseLeaseID(s string) (LeaseID, error) {
	var id LeaseID
	if len(s) != 2*len(id) {
		return id, fmt.Errorf("%w (got %d characters)", ErrInvalidLease, len(s))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return LeaseID{}, ErrInvalidLease
	}
	return id, nil
}

// LeaseEntry is one held slot of a concurrency limit: its lease and when
// the lease ends, in microseconds of the store's clock.
type LeaseEntry struct {
	ID      LeaseID
	Expires int64
}

// StepLease applies op for lease id to set, the leases of one key of a
// concurrency limit of parameters p (p.Capacity/TokenScale slots, leases
// of p.Period microseconds), at time now. It is the one definition of a
// concurrency limit that every store implements (Go in memory, Lua in
// Redis, PL/pgSQL in PostgreSQL):
//
//   - A lease is live while Expires > now; expired ones are dropped.
//   - OpTake acquires: when id holds a live lease, it is renewed (its
//     expiry becomes now + p.Period, never earlier than it was) and
//     admitted; else it is admitted when fewer than N leases are live,
//     and added with expiry now + p.Period.
//   - OpPeek answers what OpTake would, changing nothing.
//   - OpRelease releases: id's lease is removed; Allowed reports whether
//     id held a live one.
//   - OpRenew renews id's lease alone: when it is live, its expiry becomes
//     now + p.Period (never earlier) and it is admitted; else it is
//     rejected and nothing is added, so a caller cannot make a lease of
//     an id it chose, nor get back a slot whose lease ended.
//
// The Outcome describes the set after op (for a peek, after the take it
// would be): Tokens is N minus the leases held, in micro-tokens (below
// zero when more are held than a lowered N allows); ResetAfter is the
// wait until every lease has ended; a rejected acquire's RetryAfter is the
// wait until enough leases end for a slot to be free, which is an upper
// bound: a release frees one sooner (a rejected renewal has none: there
// is nothing to wait for).
//
// OpTake, OpRelease and OpRenew rewrite set in place and return the set to
// store with true; OpPeek leaves set as it was and returns false.
func StepLease(p *Params, set []LeaseEntry, now int64, op Op, id LeaseID) ([]LeaseEntry, Outcome, bool) {
	n := p.Capacity / TokenScale
	var live int64
	held := false
	for _, e := range set {
		if e.Expires > now {
			live++
			held = held || e.ID == id
		}
	}
	var o Outcome
	acquire := op == OpTake || op == OpPeek
	if acquire {
		o.Allowed = held || live < n
	} else {
		o.Allowed = held
	}
	after := set
	if op == OpPeek {
		after = slices.Clone(set)
	}
	out := after[:0]
	for _, e := range after {
		if e.Expires <= now || (op == OpRelease && e.ID == id) {
			continue
		}
		if e.ID == id && o.Allowed {
			e.Expires = max(e.Expires, now+p.Period)
		}
		out = append(out, e)
	}
	if o.Allowed && acquire && !held {
		out = append(out, LeaseEntry{ID: id, Expires: now + p.Period})
	}
	o.Tokens = (n - int64(len(out))) * TokenScale
	for _, e := range out {
		o.ResetAfter = max(o.ResetAfter, e.Expires-now)
	}
	if !o.Allowed && acquire {
		o.RetryAfter = slotFreeAfter(out, live-n+1, now)
	}
	if op == OpPeek {
		return set, o, false
	}
	return out, o, true
}

// slotFreeAfter is the wait until k of the leases of set (all live) have
// ended: the k-th earliest expiry, less now.
func slotFreeAfter(set []LeaseEntry, k, now int64) int64 {
	if k < 1 || k > int64(len(set)) {
		return 0
	}
	exp := make([]int64, len(set))
	for i, e := range set {
		exp[i] = e.Expires
	}
	slices.Sort(exp)
	return exp[k-1] - now
}
