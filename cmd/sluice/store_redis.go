package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redis"
)

// The Redis store, for store.url: redis://, rediss://, redis+sentinel://
// and redis+cluster:// (see redis.Open for the forms). The store also
// implements prometheus.Collector with its error, breaker and cache
// metrics.
func init() {
	open := func(_ context.Context, rawURL string, reg prometheus.Registerer) (sluice.Store, func() error, error) {
		s, err := redis.Open(rawURL, redis.Options{})
		if err != nil {
			return nil, nil, err
		}
		if reg != nil {
			if err := reg.Register(s); err != nil {
				s.Close()
				return nil, nil, fmt.Errorf("redis store metrics: %w", err)
			}
		}
		return s, s.Close, nil
	}
	for _, scheme := range []string{"redis", "rediss", "redis+sentinel", "redis+cluster"} {
		storeOpeners[scheme] = open
	}
}
