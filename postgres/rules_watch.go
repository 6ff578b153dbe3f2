package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/defaults"
	"github.com/sluicehq/sluice/internal/tick"
	"github.com/sluicehq/sluice/policy"
)

// rulesChannel is the NOTIFY channel of the sluice_rules trigger.
const rulesChannel = "sluice_rules"

// rulesQueryTimeout bounds one read of sluice_rules: a few rows, so a
// read this slow means the server is in trouble, and the loads of the
// config file wait behind it.
const rulesQueryTimeout = 10 * time.Second

// PolicySourceOptions configures a PolicySource.
type PolicySourceOptions struct {
	// File, when set, is the config file the table's rules join, read
	// again whenever it changes (Filename and Config are then unused): the
	// file alone is parsed first, so its problems and warnings name its
	// own lines, and its rules must be valid on their own.
	File *policy.File
	// Filename and Config are the config file the table's rules join when
	// File is nil (nil Config: the table's rules alone).
	Filename string
	Config   []byte
	Rules    RulesOptions
	// Interval is the timer refresh, a safety net for a missed
	// notification (default 30s).
	Interval time.Duration
	// NoListen turns LISTEN/NOTIFY off; only the timer refreshes.
	NoListen bool
	// OnChange is called with every newly compiled policy by the watcher
	// NewPolicySource runs.
	OnChange func(*policy.Policy)
	// Violations, when set, is told the row of every generated limit
	// (SetRuleIDs) whenever the rows change, so that its violations carry
	// their rule_id.
	Violations *ViolationLog
	// Logger reports the refused refreshes and the warnings of the
	// watcher NewPolicySource runs (default slog.Default()).
	Logger *slog.Logger
}

// PolicySource is the policy compiled from a config file and the rows of
// sluice_rules, as a policy.Source: Watch pokes on the table's NOTIFY,
// on a timer and (with a File) when the file may have changed, and Load
// reads what changed and compiles the file with the rows. policy.Watch
// keeps a running policy in step with it, keeping the last good policy
// when a load fails or yields an invalid rule; NewPolicySource starts one
// such watcher of its own.
type PolicySource struct {
	pool     *pgxpool.Pool
	ownsPool bool
	opts     PolicySourceOptions
	// stale is set when the table may have changed since the last Load
	// read it.
	stale atomic.Bool

	mu           sync.Mutex // serialises loads and guards the fields below
	loaded       bool
	name         string
	config       []byte   // the config file in force
	fileWarnings []string // its own, with its lines
	rows         []RuleRow

	current atomic.Pointer[policy.Policy]
	lastErr atomic.Pointer[error]
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewRulesSource returns the source of the policy that opts's config file
// and the rows of sluice_rules in pool make together. It reads nothing
// yet: its first Load does.
func NewRulesSource(pool *pgxpool.Pool, opts PolicySourceOptions) *PolicySource {
	defaults.Set(&opts.Interval, 30*time.Second)
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	return &PolicySource{pool: pool, opts: opts, name: opts.Filename, config: opts.Config}
}

// OpenRulesSource is NewRulesSource on a pool of its own, of two
// connections (one LISTENs, one reads the table), to the database of a
// postgres:// store URL; Close closes it. The URL's sluice_ parameters
// are ignored.
func OpenRulesSource(ctx context.Context, rawURL string, opts PolicySourceOptions) (*PolicySource, error) {
	connURL, _, err := SplitURL(rawURL)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(connURL)
	if err != nil {
		return nil, fmt.Errorf("sluice_rules: %w", err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("sluice_rules: %w", err)
	}
	s := NewRulesSource(pool, opts)
	s.ownsPool = true
	return s, nil
}

// NewPolicySource loads the rules and compiles the first policy; an
// error there is returned (there is no last good policy to keep). Then it
// watches the table with policy.Watch until Close, calling OnChange with
// every new policy and logging every refusal.
func NewPolicySource(ctx context.Context, pool *pgxpool.Pool, opts PolicySourceOptions) (*PolicySource, error) {
	s := NewRulesSource(pool, opts)
	p, err := s.Load(ctx, true)
	if err != nil {
		return nil, err
	}
	s.changed(p)
	wctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	go func() {
		defer close(s.done)
		policy.Watch(wctx, s, nil, s.changed, func(r policy.Reload) {
			if r.Err != nil {
				s.opts.Logger.Warn("postgres: rules refresh refused; keeping the last good policy", "why", r.Why, "err", r.Err)
			}
		})
	}()
	return s, nil
}

// changed is the install function of NewPolicySource's watcher.
func (s *PolicySource) changed(p *policy.Policy) {
	for _, w := range p.Warnings {
		s.opts.Logger.Warn("postgres: rules table", "warning", w)
	}
	if s.opts.OnChange != nil {
		s.opts.OnChange(p)
	}
}

// Policy returns the policy of the last Load that returned one.
func (s *PolicySource) Policy() *policy.Policy { return s.current.Load() }

// LastError returns the error of the latest Load that read something,
// nil if it succeeded. A Load that finds nothing changed (a timer, or a
// second notification of a change already read) leaves it as it was:
// the rows or the file it refused are still there.
func (s *PolicySource) LastError() error {
	if p := s.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Load implements policy.Source. It reads the config file when File
// says it changed, and the table when it may have changed (or with
// force, or the first time), and compiles them together; nil, nil when
// neither changed. A table that cannot be read when only the file
// changed leaves the rows in force, with a warning: the next timer or
// notification reads it again.
func (s *PolicySource) Load(ctx context.Context, force bool) (*policy.Policy, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, read, err := s.load(ctx, force)
	switch {
	case err != nil:
		s.lastErr.Store(&err)
	case read:
		s.lastErr.Store(nil)
	}
	return p, err
}

// load is Load; read reports that it read the table or a changed file
// and found them good, which clears the last error.
func (s *PolicySource) load(ctx context.Context, force bool) (p *policy.Policy, read bool, err error) {
	first := !s.loaded
	force = force || first
	name, config, fileWarnings := s.name, s.config, s.fileWarnings
	fileChanged := false
	if f := s.opts.File; f != nil {
		data, err := f.Read(force)
		if err != nil {
			return nil, false, err
		}
		if data != nil {
			fp, err := f.ParseData(data)
			if err != nil {
				return nil, false, err
			}
			name, config, fileWarnings, fileChanged = f.Path, data, fp.Warnings, true
		}
	}
	rows := s.rows
	var unread []string
	if s.stale.Swap(false) || force {
		rctx, cancel := context.WithTimeout(ctx, rulesQueryTimeout)
		r, err := LoadRules(rctx, s.pool)
		cancel()
		switch {
		case err == nil:
			rows, read = r, true
		case first || !fileChanged:
			return nil, false, err
		default:
			unread = []string{fmt.Sprintf("sluice_rules: %v; the rows in force stay until the table can be read", err)}
		}
	}
	if !force && !fileChanged && sameRows(rows, s.rows) {
		// Nothing changed (a timer refresh, or the one after LISTEN): the
		// policy in force stays, and so do the limits its users cached.
		return nil, read, nil
	}
	p, rowWarnings, err := compile(name, config, rows, s.opts.Rules)
	if err != nil {
		return nil, false, err
	}
	if s.opts.File != nil {
		// The merged document's own warnings repeat the file's with the
		// lines of the merge; the file's name its lines.
		p.Warnings = slices.Concat(fileWarnings, rowWarnings, unread)
	}
	s.loaded = true
	s.name, s.config, s.fileWarnings, s.rows = name, config, fileWarnings, rows
	if s.opts.Violations != nil {
		s.opts.Violations.SetRuleIDs(RuleIDs(rows, s.opts.Rules))
	}
	s.current.Store(p)
	return p, true, nil
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

// Watch implements policy.Source: it pokes on every notification of the
// table, every Interval, and as File's Watch does. Notifications come
// through one connection held with LISTEN; when it breaks, Watch
// reconnects and pokes, since notifications sent meanwhile are lost.
func (s *PolicySource) Watch(ctx context.Context, changed func(why string)) {
	table := func(why string) {
		s.stale.Store(true)
		changed(why)
	}
	var wg sync.WaitGroup
	if !s.opts.NoListen {
		wg.Go(func() { s.listen(ctx, table) })
	}
	if f := s.opts.File; f != nil {
		wg.Go(func() { f.Watch(ctx, changed) })
	}
	defer wg.Wait()
	tick.Every(ctx, s.opts.Interval, func() { table("rules table timer") })
}

// Close stops the watcher NewPolicySource started, and closes the pool
// OpenRulesSource opened.
func (s *PolicySource) Close() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
	if s.ownsPool {
		s.pool.Close()
	}
}

func (s *PolicySource) listen(ctx context.Context, changed func(string)) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, changed)
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

func (s *PolicySource) listenOnce(ctx context.Context, changed func(string)) error {
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
	changed("rules table listening")
	for {
		if _, err := c.Conn().WaitForNotification(ctx); err != nil {
			if errors.Is(err, context.Canceled) {
				return err
			}
			return fmt.Errorf("wait: %w", err)
		}
		changed("rules table changed")
	}
}
