package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/tick"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/quota"
)

// leaseSweep is how often serve ends the slices whose term or window is
// over and returns what is left of them (quota.Store.Sweep): a slice of
// a key that stopped getting requests goes back within about this much
// after its term.
var leaseSweep = 250 * time.Millisecond

// leasing is serve's leased quotas: the quota.Store over the store,
// leasing the rules with a lease: section of the policy in force. Over
// the memory store every decision is already local and exact, and
// nothing is leased: q is nil and the store is used as it is (its fast
// path kept).
type leasing struct {
	q    *quota.Store
	log  *slog.Logger
	stop func()
}

// newLeasing wraps store when it is shared (not the memory store) and
// starts the sweep.
func newLeasing(storeURL string, store sluice.Store, log *slog.Logger) *leasing {
	l := &leasing{log: log, stop: func() {}}
	if k, err := storeKindOf(storeURL); err == nil && k.schemes[0] == "memory" {
		return l
	}
	l.q = quota.New(store, quota.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick.Every(ctx, leaseSweep, func() {
			sctx, done := context.WithTimeout(ctx, time.Second)
			if err := l.q.Sweep(sctx); err != nil {
				l.log.Warn("returning ended slices of leased rules", "err", err)
			}
			done()
		})
	}()
	l.stop = func() { cancel(); wg.Wait() }
	return l
}

// store is what the Limiter decides on.
func (l *leasing) store(inner sluice.Store) sluice.Store {
	if l.q == nil {
		return inner
	}
	return l.q
}

// configure leases p's leased rules from now on, returning the slices of
// the rules leased before.
func (l *leasing) configure(p *policy.Policy) {
	set := p.Leased()
	if l.q == nil {
		if len(set) > 0 {
			l.log.Info("lease: the memory store decides every request in this process, exactly: nothing to lease", "rules", len(set))
		}
		return
	}
	if err := l.q.Configure(set); err != nil {
		// The loader checked every lease: section; a limit it let through
		// that cannot be leased is decided exactly.
		l.log.Error("leasing the policy's rules", "err", err)
	}
}

// close returns every slice (a process that stops gives its slices back;
// one that is killed loses them: under-admission only).
func (l *leasing) close() {
	l.stop()
	if l.q == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := l.q.Close(ctx); err != nil {
		l.log.Warn("returning the slices of leased rules at shutdown", "err", err)
	}
}
