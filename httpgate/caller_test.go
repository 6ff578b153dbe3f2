package httpgate_test

import (
	"context"
	"sync"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// callerSpy passes every call to the real store and keeps the Caller that
// came with it.
type callerSpy struct {
	sluice.Store
	mu   sync.Mutex
	seen []sluice.Caller
}

func (s *callerSpy) keep(ctx context.Context) {
	c, _ := sluice.CallerFrom(ctx)
	s.mu.Lock()
	s.seen = append(s.seen, c)
	s.mu.Unlock()
}

func (s *callerSpy) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	s.keep(ctx)
	return s.Store.Take(ctx, op, r)
}

func (s *callerSpy) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, _ []sluice.Decision) ([]sluice.Decision, error) {
	s.keep(ctx)
	return s.Store.TakeAll(ctx, op, rs, nil)
}

// Stores are told whom a request is for, so that one keeping violations
// can record the client and endpoint.
func TestStoreCallsCarryTheCaller(t *testing.T) {
	spy := &callerSpy{}
	e := newEnvStore(t, `
rules:
  - name: per-ip
    limit_keys: [ip:address]
    algorithm_config: {rps: 1, burst: 1}
`, func(s sluice.Store) sluice.Store { spy.Store = s; return spy })
	e.get("/v1/auth", "X-Forwarded-Uri", "/search?q=1")
	spy.mu.Lock()
	defer spy.mu.Unlock()
	if len(spy.seen) == 0 {
		t.Fatal("the store was never called")
	}
	c := spy.seen[0]
	if !c.IP.IsValid() || c.Endpoint == "" {
		t.Fatalf("store call carried caller %+v", c)
	}
}
