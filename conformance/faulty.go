package conformance

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// ErrStoreDown is the error a FaultyStore returns while Down is set.
var ErrStoreDown = errors.New("store unreachable (injected fault)")

// FaultyStore is a real store with a switch that makes every call fail as
// an unreachable shared store would. Tests of on_store_error use it beside
// their real-store tests: no real store can be made to fail at a chosen
// call.
type FaultyStore struct {
	sluice.Store
	Down atomic.Bool
}

// Take implements sluice.Store.
func (f *FaultyStore) Take(ctx context.Context, op engine.Op, c sluice.Charged) (sluice.Decision, error) {
	if f.Down.Load() {
		return sluice.Decision{}, ErrStoreDown
	}
	return f.Store.Take(ctx, op, c)
}

// TakeAll implements sluice.Store.
func (f *FaultyStore) TakeAll(ctx context.Context, op engine.Op, cs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	if f.Down.Load() {
		return nil, ErrStoreDown
	}
	return f.Store.TakeAll(ctx, op, cs, dst)
}

// Reset implements sluice.Store.
func (f *FaultyStore) Reset(ctx context.Context, l *sluice.Limit, key string) error {
	if f.Down.Load() {
		return ErrStoreDown
	}
	return f.Store.Reset(ctx, l, key)
}

// Lease implements sluice.Store.
func (f *FaultyStore) Lease(ctx context.Context, op engine.Op, r sluice.Request, id engine.LeaseID) (sluice.Decision, error) {
	if f.Down.Load() {
		return sluice.Decision{}, ErrStoreDown
	}
	return f.Store.Lease(ctx, op, r, id)
}
