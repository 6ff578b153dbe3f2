package conformance

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// Take charges r under op (sluice.Request.Charged) and hands the charged
// request to store, as a Limiter does for a limit that is not sharded: for
// the vectors, and for tests that drive a Store directly. A request that
// the rule refuses is its error, and never reaches the store.
func Take(ctx context.Context, store sluice.Store, op engine.Op, r sluice.Request) (sluice.Decision, error) {
	c, err := r.Charged(op)
	if err != nil {
		return sluice.Decision{}, err
	}
	return store.Take(ctx, op, c)
}

// TakeAll is Take of several requests, all-or-nothing, with the errors a
// Limiter's TakeAll reports ("take 2 of 3: ...").
func TakeAll(ctx context.Context, store sluice.Store, op engine.Op, rs []sluice.Request, dst []sluice.Decision) ([]sluice.Decision, error) {
	cs, err := ChargeAll(op, rs)
	if err != nil {
		return nil, err
	}
	return store.TakeAll(ctx, op, cs, dst)
}

// ChargeAll charges every request of rs under op, as a Limiter does
// before it asks its store.
func ChargeAll(op engine.Op, rs []sluice.Request) ([]sluice.Charged, error) {
	cs := make([]sluice.Charged, len(rs))
	for i, r := range rs {
		c, err := r.Charged(op)
		if err != nil {
			return nil, fmt.Errorf("take %d of %d: %w", i+1, len(rs), err)
		}
		cs[i] = c
	}
	return cs, nil
}

// requester is what the streams drive: a Store through the charges a
// Limiter would hand it (storeRequester), or a Limiter itself
// (limiterStore), which expands sharded limits.
type requester interface {
	Take(ctx context.Context, op engine.Op, r sluice.Request) (sluice.Decision, error)
	TakeAll(ctx context.Context, op engine.Op, rs []sluice.Request) ([]sluice.Decision, error)
}

type storeRequester struct{ s sluice.Store }

func (s storeRequester) Take(ctx context.Context, op engine.Op, r sluice.Request) (sluice.Decision, error) {
	return Take(ctx, s.s, op, r)
}

func (s storeRequester) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Request) ([]sluice.Decision, error) {
	return TakeAll(ctx, s.s, op, rs, nil)
}
