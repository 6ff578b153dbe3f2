package main

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// storeOpener opens a store from its URL and returns it with a function
// that releases it. The store's own metrics go to reg (nil: none).
type storeOpener func(ctx context.Context, rawURL string, reg prometheus.Registerer) (sluice.Store, func() error, error)

// storeOpeners maps URL schemes to openers; each store's file adds its
// schemes in an init function.
var storeOpeners = map[string]storeOpener{
	"memory": openMemory,
}

// parseMemoryURL reads memory://[?max_keys=N]; any other parameter is an
// error, so that a misspelt bound is not silently the default.
func parseMemoryURL(rawURL string) (memory.Options, error) {
	var opts memory.Options
	u, err := url.Parse(rawURL)
	if err != nil {
		return opts, fmt.Errorf("memory store url %q: %v", rawURL, err)
	}
	for name, vs := range u.Query() {
		switch v := vs[len(vs)-1]; name {
		case "max_keys":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return opts, fmt.Errorf("memory store url %q: max_keys %q is not a positive whole number", rawURL, v)
			}
			opts.MaxKeys = n
		default:
			return opts, fmt.Errorf("memory store url %q: unknown parameter %q (known: max_keys)", rawURL, name)
		}
	}
	return opts, nil
}

// openMemory opens memory://[?max_keys=N], registering the eviction
// counters with reg.
func openMemory(_ context.Context, rawURL string, reg prometheus.Registerer) (sluice.Store, func() error, error) {
	opts, err := parseMemoryURL(rawURL)
	if err != nil {
		return nil, nil, err
	}
	store := memory.New(opts)
	if reg != nil {
		for _, state := range []string{"full", "partial"} {
			err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        "sluice_memory_evictions_total",
				Help:        "Keys the memory store evicted at its key bound, by the state of the bucket: full (state equivalent to none) or partial (below full: evicted because no bucket was full; its owner got back what it still owed).",
				ConstLabels: prometheus.Labels{"state": state},
			}, func() float64 {
				full, partial := store.Evictions()
				if state == "full" {
					return float64(full)
				}
				return float64(partial)
			}))
			if err != nil {
				return nil, nil, fmt.Errorf("memory store metrics: %w", err)
			}
		}
	}
	return store, func() error { return nil }, nil
}

// openStore opens the store that rawURL names ("memory://" by default),
// registering its metrics with reg when not nil.
func openStore(ctx context.Context, rawURL string, reg prometheus.Registerer) (sluice.Store, func() error, error) {
	if rawURL == "" {
		rawURL = "memory://"
	}
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, nil, fmt.Errorf("store url %q: want scheme://...", rawURL)
	}
	open, ok := storeOpeners[scheme]
	if !ok {
		known := make([]string, 0, len(storeOpeners))
		for k := range storeOpeners {
			known = append(known, k)
		}
		sort.Strings(known)
		return nil, nil, fmt.Errorf("store url %q: unknown scheme %q (known: %s)", rawURL, scheme, strings.Join(known, ", "))
	}
	return open(ctx, rawURL, reg)
}
