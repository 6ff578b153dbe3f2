package adaptive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/deadline"
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

// Controller is one adaptive limit in a process: it measures the
// responses of the requests that the limit admitted, by key, and once
// per interval moves the rate by Next on the interval's verdict
// (Config.JudgeKeys). It is safe for concurrent use.
//
// Over a shared store its intervals are aligned on multiples of Interval
// (Unix time), the same in every process, and its step reports the
// interval's counts to the fleet's tally (see shared): the verdict on an
// interval is taken on the tally of every process that reported it
// before any process reported a later one, a whole interval later, and
// applied as of the interval's end, so the fleet's rate moves as one
// process measuring the whole fleet's traffic would, one interval behind.
type Controller struct {
	name   string
	key    string
	shared Values // nil: the state is this process's own

	cfg  atomic.Pointer[Config]
	rate atomic.Uint64 // math.Float64bits of the current rate
	due  atomic.Int64  // Unix microseconds when the interval ends
	busy atomic.Bool   // a step is being taken

	mu    sync.Mutex // the window and the state
	state State
	keys  keyTable

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
	c.due.Store(c.nextDue(cfg, now))
	return c
}

// nextDue is when the interval in course at now ends: now + Interval in a
// process of its own, the next multiple of Interval over a shared store,
// where every process's intervals must be the same ones.
func (c *Controller) nextDue(cfg *Config, now time.Time) int64 {
	us, iv := now.UnixMicro(), cfg.Interval.Microseconds()
	if c.shared == nil {
		return us + iv
	}
	return (us/iv + 1) * iv
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

// Observe records one response of the upstream to a request of key (the
// client's: the rule's key, or its identity): its status and its latency
// (from when the request was fully sent to the upstream's first byte,
// never the client's own upload). A status of 0 is a request whose
// client went away before any answer, or failed to send its body
// (Measure): it says nothing of the upstream and is not counted.
func (c *Controller) Observe(key string, status int, latency time.Duration) {
	if status == 0 {
		return
	}
	cfg := c.Config()
	h := keyHash(key)
	c.mu.Lock()
	c.keys.observe(h, cfg.IsError(status), cfg.TargetLatency > 0 && latency > cfg.TargetLatency)
	c.mu.Unlock()
}

// Tick takes the interval's step when now is past its end, else does
// nothing; one caller at a time takes it, the others go on with the rate
// in force. With a shared store the interval's counts are added to the
// fleet's tally and the state read, stepped and written back with a
// compare-and-swap, retried on a conflict with another process; when the
// store fails the step is taken on this process's own state and counts,
// and the error returned. The store is called until ctx's deadline even
// once ctx is cancelled: the step is the process's, not its caller's.
func (c *Controller) Tick(ctx context.Context, now time.Time) error {
	due := c.due.Load()
	if now.UnixMicro() < due || !c.busy.CompareAndSwap(false, true) {
		return nil
	}
	defer c.busy.Store(false)
	cfg := c.Config()
	c.mu.Lock()
	counts, seen := c.keys.take()
	local := c.state
	c.mu.Unlock()
	c.due.Store(c.nextDue(cfg, now))
	next, err := Next(cfg, local, cfg.JudgeKeys(tallyOf(cfg, counts)), now), error(nil)
	if c.shared != nil {
		next, err = c.step(ctx, cfg, local, due, counts, seen, now)
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
	next, err := c.step(ctx, cfg, local, 0, nil, 0, now)
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

// step reports counts, this process's measurements of a sample of seen
// keys in the interval that ended at end (Unix microseconds; 0: none, a
// Sync), to the fleet's tally. It first judges the tally there, applying
// Next to the shared state as of the tally's interval's end, when this
// report is of a later interval or an interval has passed since that one
// ended (every process has had an interval to report it). A report of an
// interval already judged is dropped. On a store failure it steps local
// on counts alone instead.
func (c *Controller) step(ctx context.Context, cfg *Config, local State, end int64, counts map[uint64]Window, seen int, now time.Time) (State, error) {
	// A step is taken by whichever request comes first after an
	// interval, and it reports the whole process's counts, not that
	// request's: on the request's context, a client that hung up as it
	// sent its request (at an interval's end, which every client can
	// compute) failed the step, and this process's keys were left out of
	// the fleet's verdict.
	ctx, cancel := deadline.Detached(ctx, stepTimeout)
	defer cancel()
	for range conflictRetries {
		raw, ok, err := c.shared.LoadValue(ctx, c.key)
		if err != nil {
			return Next(cfg, local, cfg.JudgeKeys(tallyOf(cfg, counts)), now), fmt.Errorf("adaptive %q: load the shared rate: %w", c.name, err)
		}
		cur := shared{State: local}
		if ok {
			if cur, err = parseShared(raw); err != nil {
				// Not ours to trust: write over it from this process's state.
				cur = shared{State: local}
			}
		}
		next := cur
		if cur.End != 0 && (cur.End < end || now.UnixMicro() >= cur.End+cfg.Interval.Microseconds()) {
			next.State = Next(cfg, cur.State, cfg.JudgeKeys(tallyOf(cfg, cur.Counts)), time.UnixMicro(cur.End))
			next.End, next.Counts = 0, nil
		}
		switch {
		case end == 0 || len(counts) == 0 || end <= cur.End && next.End == 0:
			// Nothing to report, or a report of an interval judged.
		case next.End == 0:
			next.End, next.Counts, next.Seen = end, make(map[uint64]Window, len(counts)), 0
			fallthrough
		case next.End == end:
			next.Seen = merge(next.Counts, next.Seen, counts, seen)
		}
		// The rate is kept within this configuration's bounds, as Next
		// does (a state written under another's).
		next.Rate = min(max(next.Rate, cfg.Min), cfg.Max)
		val := next.String()
		if ok && val == raw {
			return next.State, nil
		}
		old := ""
		if ok {
			old = raw
		}
		swapped, err := c.shared.CompareAndSwapValue(ctx, c.key, old, val, max(SharedTTL, 100*cfg.Interval))
		if err != nil {
			return Next(cfg, local, cfg.JudgeKeys(tallyOf(cfg, counts)), now), fmt.Errorf("adaptive %q: store the shared rate: %w", c.name, err)
		}
		if swapped {
			return next.State, nil
		}
	}
	return local, fmt.Errorf("adaptive %q: %w", c.name, errConflict)
}

// stepTimeout bounds a step whose caller set no deadline.
const stepTimeout = 2 * time.Second

// publish makes rate the one requests see; c.mu is held.
func (c *Controller) publish(rate float64) {
	if math.Float64bits(rate) != c.rate.Swap(math.Float64bits(rate)) && c.OnChange != nil {
		c.OnChange(rate)
	}
}

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
