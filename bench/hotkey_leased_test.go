package bench

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/quota"
)

// leasedProc is a process of the leased mode: its Redis store wrapped in
// a quota.Store that leases the hot limit with lease: {} (the defaults:
// max_slice 0.3% of the capacity, a term of 1s, hot after 8 requests).
func leasedProc(b *testing.B, addr string, spec sluice.Spec) *hotProc {
	s, _, l := openHot(b, addr, spec)
	q := quota.New(s, quota.Options{})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{l: {}}); err != nil {
		b.Fatal(err)
	}
	lim := sluice.New(q)
	return &hotProc{
		take: func(ctx context.Context, key string, cost float64) (bool, error) {
			return allowed(lim.Take(ctx, sluice.Request{Limit: l, Key: key, Cost: cost}))
		},
		stats: func() leaseCounts {
			var c leaseCounts
			for _, r := range q.Stats() {
				c.taken += r.Taken
				c.returned += r.Returned
				c.held += r.Held
			}
			return c
		},
		close: func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := q.Close(ctx); err != nil {
				b.Error(err)
			}
			s.Close()
		},
	}
}
