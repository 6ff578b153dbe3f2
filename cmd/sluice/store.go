package main

import (
	"context"
	"fmt"
	"net/url"
	"sort"
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
	"memory": func(_ context.Context, rawURL string, _ prometheus.Registerer) (sluice.Store, func() error, error) {
		u, err := url.Parse(rawURL)
		if err != nil {
			return nil, nil, err
		}
		opts := memory.Options{}
		if v := u.Query().Get("max_keys"); v != "" {
			if _, err := fmt.Sscan(v, &opts.MaxKeys); err != nil || opts.MaxKeys <= 0 {
				return nil, nil, fmt.Errorf("memory store: max_keys %q is not a positive number", v)
			}
		}
		return memory.New(opts), func() error { return nil }, nil
	},
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
