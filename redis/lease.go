package redis

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// The concurrency script: one key, a sorted set of leases (see
// lua/concurrency.lua). It is a script of its own rather than a part of
// the batched one: a lease call is made twice per request at most, so
// batching buys little, and a sorted set is no string that the batch's
// MGET could read.
var (
	//go:embed lua/concurrency.lua
	luaConcurrency string
	leaseScript    = rueidis.NewLuaScript(luaConcurrency)
)

// Lease implements sluice.Store for concurrency limits: one script call
// on the key's sorted set of leases, on the server's clock (TIME) unless
// Options.Clock is set. On a Cluster the key is one slot like any other.
// The key's TTL is the time until its last lease ends, so a key whose
// holders all died disappears by itself.
func (s *Store) Lease(ctx context.Context, op engine.Op, r sluice.Request, id engine.LeaseID) (sluice.Decision, error) {
	if err := r.CheckLease(); err != nil {
		return sluice.Decision{}, err
	}
	p := r.Limit.Params()
	key := s.prefix + r.Limit.StorageKey(r.Key)
	args := []string{leaseOp(op), id.String(), strconv.FormatInt(p.Capacity/engine.TokenScale, 10), strconv.FormatInt(p.Period, 10), s.nowArg(), s.pad}
	var res []int64
	err := s.call(ctx, key, func(ctx context.Context) (err error) {
		res, err = leaseScript.Exec(ctx, s.client, []string{key}, args).AsIntSlice()
		if err == nil && len(res) != 4 {
			err = fmt.Errorf("script returned %d values, want 4", len(res))
		}
		return err
	})
	if err != nil {
		return sluice.Decision{}, fmt.Errorf("redis %s %q: %w", op.LeaseString(), key, err)
	}
	return r.Limit.Decide(engine.Outcome{Allowed: res[0] == 1, Tokens: res[1], RetryAfter: res[2], ResetAfter: res[3]}), nil
}

// leaseOp is op's letter in the concurrency script.
func leaseOp(op engine.Op) string {
	switch op {
	case engine.OpTake:
		return "t"
	case engine.OpRelease:
		return "r"
	case engine.OpRenew:
		return "n"
	}
	return "p"
}
