package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/policy"
)

// rulesChannel is the NOTIFY channel of the sluice_rules trigger.
const rulesChannel = "sluice_rules"

// PolicySourceOptions configures a PolicySource.
type PolicySourceOptions struct {
	// Filename and Config are the config file the table's rules join (nil
	// Config: the table's rules alone).
	Filename string
	Config   []byte
	Rules    RulesOptions
	// Interval is the timer refresh, a safety net for a missed
	// notification (default 30s).
	Interval time.Duration
	// NoListen turns LISTEN/NOTIFY off; only the timer refreshes.
	NoListen bool
	// OnChange is called with every newly compiled policy.
	OnChange func(*policy.Policy)
	// Violations, when set, is told the row of every generated limit
	// (SetRuleIDs) whenever the rows change, so that its violations carry
	// their rule_id.
	Violations *ViolationLog
	// Logger reports refused refreshes (default slog.Default()).
	Logger *slog.Logger
}

// PolicySource is the policy compiled from a config file and the rows of
// sluice_rules, kept current: it reloads the table when the table's
// trigger notifies and on a timer, and keeps serving the last good policy
// when a reload fails or yields an invalid rule.
type PolicySource struct {
	pool    *pgxpool.Pool
	opts    PolicySourceOptions
	current atomic.Pointer[policy.Policy]
	mu      sync.Mutex // serialises refreshes and guards opts.Filename, opts.Config, rows
	rows    []RuleRow  // of the policy in force
	lastErr atomic.Pointer[error]
	loads   atomic.Int64
	kick    chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewPolicySource loads the rules and compiles the first policy; an
// error there is returned (there is no last good policy to keep). Then it
// watches the table until Close.
func NewPolicySource(ctx context.Context, pool *pgxpool.Pool, opts PolicySourceOptions) (*PolicySource, error) {
	if opts.Interval <= 0 {
		opts.Interval = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &PolicySource{pool: pool, opts: opts, kick: make(chan struct{}, 1), done: make(chan struct{})}
	if err := s.Refresh(ctx); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.watch(wctx)
	return s, nil
}

// Policy returns the current policy.
func (s *PolicySource) Policy() *policy.Policy { return s.current.Load() }

// Loads counts the successful refreshes, the first included.
func (s *PolicySource) Loads() int64 { return s.loads.Load() }

// LastError returns the error of the latest refresh, nil if it succeeded.
func (s *PolicySource) LastError() error {
	if p := s.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Refresh reloads the table now. On failure the current policy stays.
func (s *PolicySource) Refresh(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.refresh(ctx)
	if err != nil {
		s.lastErr.Store(&err)
		if s.current.Load() != nil {
			s.opts.Logger.Warn("postgres: rules refresh refused; keeping the last good policy", "err", err)
		}
		return err
	}
	s.lastErr.Store(nil)
	return nil
}

func (s *PolicySource) refresh(ctx context.Context) error {
	rows, err := LoadRules(ctx, s.pool)
	if err != nil {
		return err
	}
	if s.current.Load() != nil && sameRows(rows, s.rows) {
		// Nothing changed (a timer refresh, or the one after LISTEN): the
		// policy in force stays, and so do the limits its users cached.
		return nil
	}
	p, warnings, err := compile(s.opts.Filename, s.opts.Config, rows, s.opts.Rules)
	if err != nil {
		return err
	}
	s.warn(warnings)
	s.rows = rows
	if s.opts.Violations != nil {
		s.opts.Violations.SetRuleIDs(RuleIDs(rows, s.opts.Rules))
	}
	s.lastErr.Store(nil) // before install, whose OnChange may ask
	s.install(p)
	return nil
}

// sameRows reports whether two loads of the table read the same rows.
func sameRows(a, b []RuleRow) bool {
	return slices.EqualFunc(a, b, func(x, y RuleRow) bool {
		return x.ID == y.ID && x.KeyPattern == y.KeyPattern && x.Scope == y.Scope &&
			(x.RatePerSecond == y.RatePerSecond || (x.RatePerSecond != x.RatePerSecond && y.RatePerSecond != y.RatePerSecond)) &&
			x.Burst == y.Burst && x.Plan == y.Plan && x.Active == y.Active &&
			x.Description == y.Description && x.CreatedAt.Equal(y.CreatedAt)
	})
}

// SetConfig replaces the config file the table's rules join (a reloaded
// file) and recompiles with the rows in force. When the result is invalid
// it returns the error and changes nothing.
func (s *PolicySource) SetConfig(filename string, config []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, warnings, err := compile(filename, config, s.rows, s.opts.Rules)
	if err != nil {
		return err
	}
	s.warn(warnings)
	s.opts.Filename, s.opts.Config = filename, config
	s.install(p)
	return nil
}

// warn logs the rows of a newly compiled policy that apply to no request.
func (s *PolicySource) warn(warnings []string) {
	for _, w := range warnings {
		s.opts.Logger.Warn("postgres: rules table", "warning", w)
	}
}

// install puts p in force; s.mu is held.
func (s *PolicySource) install(p *policy.Policy) {
	s.current.Store(p)
	s.loads.Add(1)
	if s.opts.OnChange != nil {
		s.opts.OnChange(p)
	}
}

// Close stops watching.
func (s *PolicySource) Close() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
}

// watch refreshes on every notification and on the timer. Notifications
// come through one connection held with LISTEN; when it breaks, the
// watcher reconnects and refreshes, since notifications sent meanwhile
// are lost.
func (s *PolicySource) watch(ctx context.Context) {
	defer close(s.done)
	if !s.opts.NoListen {
		go s.listen(ctx)
	}
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
		rctx, cancel := context.WithTimeout(ctx, s.opts.Interval)
		s.Refresh(rctx)
		cancel()
	}
}

func (s *PolicySource) poke() {
	select {
	case s.kick <- struct{}{}:
	default: // a refresh is already due; it will see this change too
	}
}

func (s *PolicySource) listen(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		s.opts.Logger.Warn("postgres: rules LISTEN connection lost; reconnecting", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func (s *PolicySource) listenOnce(ctx context.Context) error {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	defer func() {
		// The connection is LISTENing: close it rather than hand it back.
		conn := c.Hijack()
		conn.Close(context.Background())
	}()
	if _, err := c.Exec(ctx, "LISTEN "+rulesChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// Changes made before LISTEN took effect were not notified.
	s.poke()
	for {
		if _, err := c.Conn().WaitForNotification(ctx); err != nil {
			if errors.Is(err, context.Canceled) {
				return err
			}
			return fmt.Errorf("wait: %w", err)
		}
		s.poke()
	}
}
