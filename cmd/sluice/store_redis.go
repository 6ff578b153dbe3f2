package main

import (
	"context"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redis"
)

// The Redis store, for store.url: redis://, rediss://, redis+sentinel://
// and redis+cluster:// (see redis.Open for the forms). The store also
// implements prometheus.Collector with its error, breaker and cache
// metrics.
func init() {
	open := func(_ context.Context, rawURL string) (sluice.Store, func() error, error) {
		s, err := redis.Open(rawURL, redis.Options{})
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	}
	for _, scheme := range []string{"redis", "rediss", "redis+sentinel", "redis+cluster"} {
		storeOpeners[scheme] = open
	}
}
