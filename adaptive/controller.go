package adaptive

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Values is a store that keeps small values every process of a fleet
// reads: the redis store implements it. A Controller over one keeps its
// State there, so that the fleet shares one rate.
type Values interface {
	// LoadValue returns the value kept under key; ok is false when there
	// is none.
	LoadValue(ctx context.Context, key string) (value string, ok bool, err error)
	// CompareAndSwapValue stores value under key, to expire after ttl,
	// if what is kept there is still old ("" for nothing), and reports
	// whether it did.
	CompareAndSwapValue(ctx context.Context, key, old, value string, ttl time.Duration) (bool, error)
}

// SharedTTL is how long a shared State outlives its last step: a limit
// idle in the whole fleet for that long starts again at its Start.
const SharedTTL = time.Hour

// maxSamples bounds the latencies a Controller keeps per interval; past
// it, each new one replaces a random kept one (reservoir sampling), so the
// percentile stays an unbiased estimate at any traffic.
const maxSamples = 512

// Controller is one adaptive limit in a process: it measures the
// responses of the requests that the limit admitted and, once per
// interval, moves the rate by Next. It is safe for concurrent use.
type Controller struct {
	name   string
	key    string
	shared Values // nil: the state is this process's own

	cfg  atomic.Pointer[Config]
	rate atomic.Uint64 // math.Float64bits of the current rate
	due  atomic.Int64  // Unix microseconds when the interval ends
	busy atomic.Bool   // a step is being taken

	mu        sync.Mutex // the window and the state
	state     State
	responses int
	errors    int
	seen      int // latencies offered this interval
	samples   []time.Duration

	// OnChange, when set before use, is told every new rate.
	OnChange func(rate float64)
}

// NewController returns the controller of the limit called name under
// cfg (WithDefaults applied, Validate passed), starting at now. With
// shared, the state is kept there under "adaptive:" + name.
func NewController(name string, cfg *Config, shared Values, now time.Time) *Controller {
	c := &Controller{name: name, key: "adaptive:" + name, shared: shared}
	c.cfg.Store(cfg)
	c.state = cfg.Initial()
	c.rate.Store(math.Float64bits(c.state.Rate))
	c.due.Store(now.Add(cfg.Interval).UnixMicro())
	return c
}

// Name is the limit's name.
func (c *Controller) Name() string { return c.name }

// Config is the configuration in force.
func (c *Controller) Config() *Config { return c.cfg.Load() }

// SetConfig puts cfg in force (a reloaded policy): the rate is brought
// within its bounds at once.
func (c *Controller) SetConfig(cfg *Config) {
	if c.cfg.Swap(cfg) == cfg {
		return
	}
	c.mu.Lock()
	c.state.Rate = min(max(c.state.Rate, cfg.Min), cfg.Max)
	c.publish(c.state.Rate)
	c.mu.Unlock()
}

// Rate is the current rate, in tokens per Config().Per.
func (c *Controller) Rate() float64 { return math.Float64frombits(c.rate.Load()) }

// Scale is Config().Scale(Rate()): what a request's cost is multiplied
// by now.
func (c *Controller) Scale() float64 { return c.Config().Scale(c.Rate()) }

// Observe records one response of the upstream: its status and how long
// it took to come (to its headers). A status of 0 is a request whose
// client went away before any answer: it says nothing of the upstream
// and is not counted.
func (c *Controller) Observe(status int, latency time.Duration) {
	if status == 0 {
		return
	}
	cfg := c.Config()
	c.mu.Lock()
	c.responses++
	if cfg.IsError(status) {
		c.errors++
	}
	c.seen++
	if len(c.samples) < maxSamples {
		c.samples = append(c.samples, latency)
	} else if i := rand.IntN(c.seen); i < maxSamples {
		c.samples[i] = latency
	}
	c.mu.Unlock()
}

// Tick takes the interval's step when now is past its end, else does
// nothing; one caller at a time takes it, the others go on with the rate
// in force. With a shared store the step is read, computed and written
// back with a compare-and-swap, retried on a conflict with another
// process; when the store fails the step is taken on this process's own
// state, and the error returned.
func (c *Controller) Tick(ctx context.Context, now time.Time) error {
	if now.UnixMicro() < c.due.Load() || !c.busy.CompareAndSwap(false, true) {
		return nil
	}
	defer c.busy.Store(false)
	cfg := c.Config()
	c.mu.Lock()
	w := Window{Responses: c.responses, Errors: c.errors, Latency: Percentile(c.samples, cfg.Percentile)}
	c.responses, c.errors, c.seen, c.samples = 0, 0, 0, c.samples[:0]
	local := c.state
	c.mu.Unlock()
	c.due.Store(now.Add(cfg.Interval).UnixMicro())
	h := cfg.Judge(w)
	next, err := Next(cfg, local, h, now), error(nil)
	if c.shared != nil {
		next, err = c.step(ctx, cfg, local, h, now)
	}
	c.mu.Lock()
	c.state = next
	c.publish(next.Rate)
	c.mu.Unlock()
	return err
}

// Sync reads the shared state without judging an interval: a process
// that starts adopts the fleet's rate at once.
func (c *Controller) Sync(ctx context.Context, now time.Time) error {
	if c.shared == nil {
		return nil
	}
	cfg := c.Config()
	c.mu.Lock()
	local := c.state
	c.mu.Unlock()
	next, err := c.step(ctx, cfg, local, Idle, now)
	c.mu.Lock()
	c.state = next
	c.publish(next.Rate)
	c.mu.Unlock()
	return err
}

// conflictRetries bounds the compare-and-swap attempts of one step: each
// conflict means another process has just stepped, and Next's once per
// interval makes a further conflict unlikely.
const conflictRetries = 3

// errConflict is a step that lost every compare-and-swap to other
// processes: this interval's step is skipped.
var errConflict = errors.New("the shared rate kept changing; this interval's step is skipped")

// step applies Next to the shared state. On a store failure it steps
// local instead.
func (c *Controller) step(ctx context.Context, cfg *Config, local State, h Health, now time.Time) (State, error) {
	for range conflictRetries {
		raw, ok, err := c.shared.LoadValue(ctx, c.key)
		if err != nil {
			return Next(cfg, local, h, now), fmt.Errorf("adaptive %q: load the shared rate: %w", c.name, err)
		}
		cur := local
		if ok {
			if cur, err = ParseState(raw); err != nil {
				// Not ours to trust: write over it from this process's state.
				cur = local
			}
		}
		next := Next(cfg, cur, h, now)
		if ok && next == cur && raw == cur.String() {
			return cur, nil
		}
		old := ""
		if ok {
			old = raw
		}
		swapped, err := c.shared.CompareAndSwapValue(ctx, c.key, old, next.String(), max(SharedTTL, 100*cfg.Interval))
		if err != nil {
			return Next(cfg, local, h, now), fmt.Errorf("adaptive %q: store the shared rate: %w", c.name, err)
		}
		if swapped {
			return next, nil
		}
	}
	return local, fmt.Errorf("adaptive %q: %w", c.name, errConflict)
}

// publish makes rate the one requests see; c.mu is held.
func (c *Controller) publish(rate float64) {
	if math.Float64bits(rate) == c.rate.Swap(math.Float64bits(rate)) {
		return
	}
	if c.OnChange != nil {
		c.OnChange(rate)
	}
}
