package adaptive

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Registry keeps the Controller of each adaptive limit by the limit's
// name, made on first use, so that a rate outlives a reload that keeps
// the name (as bucket state does). It is safe for concurrent use; the
// zero value keeps every rate in this process.
type Registry struct {
	// Shared, when set before use, keeps the rates where a fleet shares
	// them (a store's Values, such as Redis's), so that a fleet moves one
	// rate; nil keeps them in this process.
	Shared Values
	// OnRate, when set before use, is told a limit's rate when its
	// controller is made and each time it changes, with its Config.
	OnRate func(name string, rate float64, cfg *Config)
	// Logger, when set before use, receives a shared store's failures.
	Logger *slog.Logger

	mu     sync.Mutex
	byName map[string]*Controller
}

// Get returns the controller of the limit name, nil before its first use.
func (rg *Registry) Get(name string) *Controller {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return rg.byName[name]
}

// Controller returns the controller of the limit name under cfg, made on
// first use, once it has taken the step due at now (see Tick).
func (rg *Registry) Controller(ctx context.Context, name string, cfg *Config, now time.Time) *Controller {
	rg.mu.Lock()
	ctl := rg.byName[name]
	if ctl != nil {
		rg.mu.Unlock()
		ctl.SetConfig(cfg)
		rg.Tick(ctx, ctl, now)
		return ctl
	}
	if rg.byName == nil {
		rg.byName = map[string]*Controller{}
	}
	ctl = NewController(name, cfg, rg.Shared, now)
	if rg.OnRate != nil {
		ctl.OnChange = func(rate float64) { rg.OnRate(name, rate, ctl.Config()) }
	}
	rg.byName[name] = ctl
	rg.mu.Unlock()
	if rg.OnRate != nil {
		rg.OnRate(name, ctl.Rate(), cfg)
	}
	if err := ctl.Sync(ctx, now); err != nil && rg.Logger != nil {
		rg.Logger.Warn("adaptive rate: starting from this process's own", "limit", name, "err", err)
	}
	rg.Tick(ctx, ctl, now)
	return ctl
}

// Tick takes ctl's step when its interval is over, logging a shared
// store's failure (the step is then taken on this process's state).
func (rg *Registry) Tick(ctx context.Context, ctl *Controller, now time.Time) {
	if err := ctl.Tick(ctx, now); err != nil && rg.Logger != nil {
		rg.Logger.Warn("adaptive rate: stepped on this process's own state", "limit", ctl.Name(), "err", err)
	}
}
