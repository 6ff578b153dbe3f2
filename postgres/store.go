// Package postgres is sluice's PostgreSQL store, with the two tables that
// live beside it: rate-limit rules managed with SQL (a rule source that
// reloads on LISTEN/NOTIFY) and an audit trail of violations written in
// batches with COPY.
//
// A take is one statement, INSERT ... ON CONFLICT (key) DO UPDATE ...
// RETURNING, whose update evaluates the algorithm (the root package's
// integer arithmetic, transcribed to the PL/pgSQL function sluice_step)
// on the locked row. That makes it race-free under READ COMMITTED: the
// update runs once, on the newest version of the row, however many
// sessions collide. The time is the server's clock_timestamp() (not now(),
// which is frozen at the start of the transaction), read once per
// statement; a clock that steps back adds no tokens. A rejection leaves the
// state as it was and still reports remaining and retry-after.
//
// A refund (engine.OpRefund) is one UPDATE of an existing row through the
// PL/pgSQL function sluice_refund, the root package's refund arithmetic;
// it inserts nothing, since a key with no row is full already.
//
// TakeAll runs in one transaction, locking its rows in key order so that
// concurrent multi-limit requests never deadlock, and rolls back when any
// limit rejects. WithTx binds the store to a caller's transaction, so a
// charge made inside it is undone by its rollback.
//
// Rows whose bucket has refilled are equivalent to absent rows: a
// housekeeping loop deletes them in small batches through an index on the
// time they become full.
package postgres

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/breaker"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/internal/defaults"
)

// Options configures a Store.
type Options struct {
	// KeyPrefix is prepended to every storage key, so that several
	// applications (or tests) can share one table without sharing buckets.
	KeyPrefix string
	// Migrate applies the embedded migrations when the store opens.
	Migrate bool
	// HousekeepingInterval is how often rows of full buckets are deleted
	// (default one minute); negative disables the loop (call Housekeep).
	HousekeepingInterval time.Duration
	// HousekeepingBatch is the most rows one DELETE removes (default 1000),
	// which bounds how long it holds row locks.
	HousekeepingBatch int
	// Logger reports housekeeping failures (default slog.Default()).
	Logger *slog.Logger
	// Violations, when set, records every rejection of a take.
	Violations *ViolationLog
	// RecordViolations, when set and Violations is not, makes the store
	// start a ViolationLog of its own on its pool (closed by Close).
	RecordViolations *ViolationOptions
	// Clock replaces the server's clock. For tests only: in production every
	// client must read the one server clock so that they agree.
	Clock sluice.Clock
	// Timeout bounds every call to the server (default one second;
	// sluice serve uses 250ms unless the URL's sluice_timeout says
	// otherwise); a caller's earlier deadline wins. A call past either is a store
	// failure, decided by the caller (a rule's on_store_error), and counts
	// toward the circuit breaker.
	Timeout time.Duration
	// BreakerFailures failed calls within a window, when they are at
	// least half of the window's calls, open the circuit breaker (default
	// 5). The window is 2*BreakerFailures*Timeout, at least a second (10s
	// with the defaults, 2.5s under sluice serve), so that one caller,
	// whose calls to a hung server fail one per Timeout, opens it: after
	// BreakerFailures deadlines when the window holds nothing else, at most
	// a window plus that when earlier successes outnumber the failures.
	// Then for BreakerBackoff (default 500ms) every call fails at once with
	// ErrBreakerOpen instead of waiting for a server that is not
	// answering, then one call probes. A store made by WithTx has none:
	// the caller's transaction decides.
	BreakerFailures int
	BreakerBackoff  time.Duration
	// LockTimeout bounds how long a statement waits for a row lock that
	// another session holds (PostgreSQL's lock_timeout), so that a row
	// locked by a long transaction fails a take with lock_not_available
	// (55P03) early, counting toward the breaker, instead of holding it to
	// the call's deadline. Default a quarter of Timeout; negative leaves
	// the server's setting. Open sets it on the connections of the pool it
	// makes, unless the URL sets lock_timeout itself; a pool given to New
	// keeps its own (set lock_timeout in its RuntimeParams or URL).
	LockTimeout time.Duration
	// Observer, when set, is told of failed calls and of the circuit
	// breaker's states, for metrics (metrics.NewPostgresObserver).
	Observer Observer
}

// ErrBreakerOpen is returned, wrapped, while the circuit breaker keeps
// calls away from a PostgreSQL that has been failing.
var ErrBreakerOpen = errors.New("postgres store: circuit breaker open")

// querier is what the store needs of a pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Store is the PostgreSQL Store. It is safe for concurrent use, except a
// Store returned by WithTx, which is as safe as its transaction (not).
type Store struct {
	pool   *pgxpool.Pool
	q      querier
	opts   Options
	br     *breaker.Breaker // nil for a WithTx view
	ownsDB bool
	// ownsLog: the violation log was started by the store.
	ownsLog bool
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// clockSQL reads the server's clock in integer microseconds. extract
// returns numeric (PostgreSQL 14+), so the conversion is exact.
const clockSQL = `(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`

// stepArgs are the arguments of sluice_step after the state, in the
// statements' parameter numbering ($4 now, $5 cost, $6 num, ...).
const stepArgs = `$5::bigint, %s, $6::bigint, $3::bigint, $7::bigint, $8::bigint, $9::bigint, $10::bigint, $11::boolean, $12::bigint`

// refundArgs are the arguments of sluice_refund after the time, in the
// same parameter numbering ($5 is the amount to give back).
const refundArgs = `$5::bigint, $6::bigint, $3::bigint, $7::bigint, $8::bigint, $9::bigint, $10::bigint`

// The den column records the unit a row's state was written in (unit):
// a token bucket's rate denominator, a fixed or calendar window's
// capacity. Rows of fixed windows written before the capacity was
// recorded have 0 there, which engine.ConvertWindow keeps as they are.

// convertSQL is row t's tokens in the units of the request's limit:
// engine.ConvertBucket for a token bucket written under another rate
// denominator than $3 (a limit reloaded with another rate, period or
// capacity keeps its buckets), engine.ConvertWindow for a fixed window
// written under another capacity than $3 (fixedConvertSQL), t.a as it is
// otherwise. A bucket keeps whole micro-tokens, floored, at most the
// capacity $7, and a debt of at most engine.MaxDebt (the range below 2^52,
// or 2^62 for a capacity beyond it).
var convertSQL = `CASE WHEN t.den = $3::bigint THEN t.a
    WHEN $2::smallint = 1 THEN ` + fixedConvertSQL + `
    WHEN t.den <= 0 OR $3::bigint <= 0 THEN t.a
    ELSE greatest(least(floor(t.a::numeric / t.den)::bigint, $7::bigint),
        -greatest(0, (CASE WHEN $7::bigint > 4503599627370495 / $3::bigint THEN 4611686018427387903 ELSE 4503599627370495 END) / $3::bigint - $7::bigint))
        * $3::bigint END`

// fixedConvertSQL is engine.ConvertWindow of row t, written under
// capacity t.den, for the fixed window of capacity $7, rate $8 per period
// $9: a debt kept up to engine.MaxDebt (maxDebtSQL), a row of no recorded
// capacity at most $7, else $7 less what the window used, at least zero.
var fixedConvertSQL = `CASE WHEN t.a < 0 THEN greatest(t.a, -` + fixedMaxDebtSQL + `)
        WHEN t.den <= 0 THEN least(t.a, $7::bigint)
        ELSE greatest(0, least(t.a, t.den) - t.den + $7::bigint) END`

// fixedMaxDebtSQL is engine.MaxDebt of the fixed window of capacity $7,
// rate $8 per period $9: the most debt whose payment ends within 2^52
// (or, for a capacity beyond that, 2^62).
var fixedMaxDebtSQL = `greatest(0, (CASE WHEN $7::bigint > ` + mostSQL(1<<52) + ` THEN ` + mostSQL(1<<62) + ` ELSE ` + mostSQL(1<<52) + ` END) - $7::bigint)`

// mostSQL is the inner bound of engine.MaxDebt for a fixed window: the
// tokens whose payment ends within hi microseconds.
func mostSQL(hi int64) string {
	w := fmt.Sprintf("(%d / $9::bigint - 1)", hi-1)
	return fmt.Sprintf("(CASE WHEN %s <= 0 THEN 0 ELSE least(%d, %s::numeric * $8::bigint)::bigint END)", w, hi-1, w)
}

// convertedSQL is whether row t is a token bucket converted from another
// rate denominator: a take then writes it, admitted or not, converted but
// not refilled (the state it was, in the new units), so that its full_at,
// when housekeeping may delete it as a full bucket, is the new limit's. A
// fixed window is converted as it is read and written only when a take is
// admitted (engine.ConvertWindow's rule): a limit lowered and raised back
// before any write finds the count it had. Its full_at, the old limit's
// time to full, is the new one's unless the window's rate changed too:
// what the window used, and so the wait for it to come back, is kept.
const convertedSQL = `(t.alg = EXCLUDED.alg AND t.den <> EXCLUDED.den AND EXCLUDED.alg <> 1)`

var (
	takeSQL = `INSERT INTO sluice_buckets AS t
    (key, alg, den, a, b, log_at, log_cost, full_at, at, o_allowed, o_tokens, o_retry, o_reset)
SELECT $1::bytea, $2::smallint, $3::bigint, s.a, s.b, s.log_at, s.log_cost, c.now + s.reset, c.now,
    s.allowed, s.tokens, s.retry, s.reset
FROM (SELECT coalesce($4::bigint, ` + clockSQL + `) AS now) c
CROSS JOIN LATERAL sluice_step(false, $2::smallint, 0, 0, NULL, NULL, c.now, ` + fmt.Sprintf(stepArgs, "true") + `) s
ON CONFLICT (key) DO UPDATE SET
    (alg, den, a, b, log_at, log_cost, full_at, at, o_allowed, o_tokens, o_retry, o_reset) = (
    SELECT
        CASE WHEN s.write THEN EXCLUDED.alg ELSE t.alg END,
        CASE WHEN s.write OR ` + convertedSQL + ` THEN EXCLUDED.den ELSE t.den END,
        CASE WHEN s.write THEN s.a WHEN ` + convertedSQL + ` THEN ` + convertSQL + ` ELSE t.a END,
        CASE WHEN s.write THEN s.b ELSE t.b END,
        CASE WHEN s.write THEN s.log_at ELSE t.log_at END,
        CASE WHEN s.write THEN s.log_cost ELSE t.log_cost END,
        CASE WHEN s.write OR ` + convertedSQL + ` THEN EXCLUDED.at + s.reset ELSE t.full_at END,
        EXCLUDED.at, s.allowed, s.tokens, s.retry, s.reset
    FROM sluice_step(t.alg = EXCLUDED.alg, EXCLUDED.alg,
        ` + convertSQL + `, t.b, t.log_at, t.log_cost, EXCLUDED.at, ` + fmt.Sprintf(stepArgs, "true") + `) s)
RETURNING o_allowed, o_tokens, o_retry, o_reset`

	// refundSQL gives tokens back to an existing row (sluice_refund) and
	// inserts none: an absent key is full already, and so is a row written
	// under another algorithm, which is left as it is; a row of another
	// rate denominator is converted (convertSQL). Under READ COMMITTED the
	// update waits for a concurrent take's lock and then refunds the newest
	// row version. When it updates nothing, the second branch answers for
	// the absent key. The clock is read once, in the CTE c.
	refundSQL = refundOf(`sluice_refund(true, t.alg, `+convertSQL+`, t.b, t.log_at, t.log_cost, c.now, `+refundArgs+`)`,
		`sluice_refund(false, $2::smallint, 0, 0, NULL, NULL, c.now, `+refundArgs+`)`)

	peekSQL = peekOf(`sluice_step`, convertSQL+`, t.b, t.log_at, t.log_cost, c.now, `+fmt.Sprintf(stepArgs, "false"))
)

// refundOf is a refund statement (see refundSQL): step on an existing
// row of the request's algorithm, which it updates, else absent, the
// answer for a key without one.
func refundOf(step, absent string) string {
	return `WITH c AS MATERIALIZED (SELECT coalesce($4::bigint, ` + clockSQL + `) AS now),
u AS (
    UPDATE sluice_buckets AS t SET
        (den, a, b, log_at, log_cost, full_at, at, o_allowed, o_tokens, o_retry, o_reset) = (
        SELECT $3::bigint, s.a, s.b, s.log_at, s.log_cost, c.now + s.reset, c.now, s.allowed, s.tokens, s.retry, s.reset
        FROM c CROSS JOIN LATERAL ` + step + ` s)
    WHERE t.key = $1::bytea AND t.alg = $2::smallint
    RETURNING t.o_allowed, t.o_tokens, t.o_retry, t.o_reset)
SELECT o_allowed, o_tokens, o_retry, o_reset FROM u
UNION ALL
SELECT s.allowed, s.tokens, s.retry, s.reset
FROM c CROSS JOIN LATERAL ` + absent + ` s
WHERE NOT EXISTS (SELECT FROM u)`
}

// peekOf is a peek statement: fn on the key's row, or on nothing, with
// the arguments that follow the row's presence and algorithm.
func peekOf(fn, args string) string {
	return `SELECT s.allowed, s.tokens, s.retry, s.reset
FROM (SELECT coalesce($4::bigint, ` + clockSQL + `) AS now) c
LEFT JOIN sluice_buckets t ON t.key = $1::bytea
CROSS JOIN LATERAL ` + fn + `(coalesce(t.alg = $2::smallint, false), $2::smallint,
    ` + args + `) s`
}

// New returns a Store over pool, which the caller keeps and closes after
// Close; its connections must read committed, as Open's do. It applies
// the migrations first when opts.Migrate is set.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Store, error) {
	opts.HousekeepingInterval = cmp.Or(opts.HousekeepingInterval, time.Minute)
	defaults.Set(&opts.HousekeepingBatch, 1000)
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	defaults.Set(&opts.Timeout, time.Second)
	defaults.Set(&opts.BreakerFailures, 5)
	defaults.Set(&opts.BreakerBackoff, 500*time.Millisecond)
	opts.LockTimeout = cmp.Or(opts.LockTimeout, opts.Timeout/4)
	opts.Observer = cmp.Or[Observer](opts.Observer, noObserver{})
	if opts.Migrate {
		if _, err := MigratePool(ctx, pool); err != nil {
			return nil, err
		}
	}
	s := &Store{pool: pool, q: pool, opts: opts, br: breaker.ForDeadline(opts.BreakerFailures, opts.BreakerBackoff, opts.Timeout, opts.Observer.BreakerChanged), stop: make(chan struct{}), done: make(chan struct{})}
	if opts.Violations == nil && opts.RecordViolations != nil {
		v, err := NewViolationLog(pool, *opts.RecordViolations)
		if err != nil {
			return nil, err
		}
		s.opts.Violations, s.ownsLog = v, true
	}
	if opts.HousekeepingInterval > 0 {
		go s.housekeeping()
	} else {
		close(s.done)
	}
	return s, nil
}

// Open connects to the database at url (a PostgreSQL connection URL; pgxpool
// settings such as pool_max_conns go in its query) and returns a Store that
// owns the connection pool.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	if v := lockTimeoutSetting(opts); v != "" && cfg.ConnConfig.RuntimeParams["lock_timeout"] == "" {
		// A startup parameter: every connection has it, without a round trip.
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = v
	}
	// Takes are race-free under read committed; under a stricter default a
	// take that waited for a row fails (TestAttackSerializableDatabaseFailsContendedTakes).
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	s, err := New(ctx, pool, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownsDB = true
	return s, nil
}

// lockTimeoutSetting is opts' lock_timeout as PostgreSQL reads it (whole
// milliseconds, at least one: 0 would mean no bound), or "" to leave the
// server's.
func lockTimeoutSetting(opts Options) string {
	d := opts.LockTimeout
	if d == 0 {
		t := opts.Timeout
		defaults.Set(&t, time.Second)
		d = t / 4
	}
	if d < 0 {
		return ""
	}
	return fmt.Sprintf("%dms", max(d.Milliseconds(), 1))
}

// Close stops housekeeping and, for a store made by Open, closes the pool.
func (s *Store) Close() {
	s.once.Do(func() {
		close(s.stop)
		<-s.done
		if s.ownsLog {
			s.opts.Violations.Close()
		}
		if s.ownsDB {
			s.pool.Close()
		}
	})
}

// Violations returns the store's violation log, or nil.
func (s *Store) Violations() *ViolationLog { return s.opts.Violations }

// Pool returns the store's connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// WithTx returns a view of the store that runs every statement in tx, the
// caller's transaction: a charge made through it commits or rolls back
// with tx. Its row locks are held until tx ends, so keep such transactions
// short. TakeAll through it uses a savepoint. The transaction should be
// READ COMMITTED (PostgreSQL's default): under REPEATABLE READ or
// SERIALIZABLE a take on a row that another transaction changed fails
// with a serialization error, which the caller must retry. The view runs
// no housekeeping and needs no Close.
func (s *Store) WithTx(tx pgx.Tx) *Store {
	v := &Store{pool: s.pool, q: tx, opts: s.opts, ownsLog: false, stop: make(chan struct{}), done: make(chan struct{})}
	close(v.done)
	return v
}

// wallNow is this process's time, or the test clock's.
func (s *Store) wallNow() time.Time {
	if s.opts.Clock != nil {
		return s.opts.Clock.Now()
	}
	return time.Now()
}

// now returns the test clock's time, or nil for the server's clock.
func (s *Store) now() any {
	if s.opts.Clock == nil {
		return nil
	}
	return s.opts.Clock.Now().UnixMicro()
}

// maxRowKey bounds a row's key: the primary key's index refuses rows of
// 2704 bytes (TestAttackLongKeyEscapesPostgres). A longer key is its start
// and the hash of the whole, a length no key kept as it is has.
const maxRowKey = 2560

func (s *Store) rowKey(l *sluice.Limit, key string) []byte {
	k := []byte(s.opts.KeyPrefix + l.StorageKey(key))
	if len(k) <= maxRowKey {
		return k
	}
	sum := sha256.Sum256(k)
	return hex.AppendEncode(k[:maxRowKey], sum[:])
}

// args are the statement parameters of one request.
func (s *Store) args(r sluice.Charged, now any) []any {
	if r.Limit.Params().Windowed() {
		return s.windowArgs(r, now)
	}
	ch := r.Charge
	p := r.Limit.Params()
	var off int64
	if p.Algorithm == engine.FixedWindow {
		off = p.Offset
		if off < 0 {
			off = engine.WindowOffset(r.Key, p.Period)
		}
	}
	return []any{
		s.rowKey(r.Limit, r.Key), int16(p.Algorithm), unit(p), now,
		ch.Cost, p.RateNum, p.Capacity, p.WindowRate, p.Period, off, ch.Reserve, ch.MaxReserved,
	}
}

// unit is what a row written for a limit of parameters p records in its
// den column ($3): the rate denominator of a token bucket, the capacity
// of a fixed or calendar window (so that a reload that changes either is
// converted: convertSQL), zero for the rest.
func unit(p *engine.Params) int64 {
	if p.Algorithm == engine.FixedWindow {
		return p.Capacity
	}
	return p.RateDen
}

// opSQL returns the statement of op and how many of the parameters that
// args makes it takes. An unknown op is a peek, which changes nothing.
func opSQL(op engine.Op) (string, int) {
	switch op {
	case engine.OpTake:
		return takeSQL, 12
	case engine.OpRefund:
		return refundSQL, 10
	default:
		return peekSQL, 12
	}
}

// guarded runs a call to the server under the circuit breaker and the
// store's deadline. A WithTx view runs it as it is.
func (s *Store) guarded(ctx context.Context, call func(context.Context) error) error {
	if s.br == nil {
		return call(ctx)
	}
	if !s.br.Allow() {
		s.opts.Observer.StoreError()
		return ErrBreakerOpen
	}
	cctx, cancel := deadline.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	err := call(cctx)
	switch {
	case err == nil:
		s.br.Done(true)
	case errors.Is(ctx.Err(), context.Canceled):
		s.br.Abort() // the caller gave up: that says nothing of the server
	default:
		// An error about the statement says the server is there; one
		// that says it cannot serve now (a lock wait past lock_timeout,
		// too many connections, a shutdown) counts against it, as does
		// running out of time, the store's or the caller's: the call was
		// in its hands (serverAnswered).
		s.opts.Observer.StoreError()
		s.br.Done(serverAnswered(err))
	}
	return err
}

// Take implements sluice.Store.
func (s *Store) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	args := s.args(r, s.now())
	sql, params := opSQL(op)
	sql, params = forWindow(r.Limit, sql, params)
	var o engine.Outcome
	err := s.guarded(ctx, func(ctx context.Context) error {
		return s.q.QueryRow(ctx, sql, args[:params]...).Scan(&o.Allowed, &o.Tokens, &o.RetryAfter, &o.ResetAfter)
	})
	if err != nil {
		return sluice.Decision{}, fmt.Errorf("postgres take %q: %w", args[0], err)
	}
	d := r.Limit.Decide(o)
	if !d.Allowed && op == engine.OpTake {
		s.recordViolation(ctx, args[0].([]byte), d)
	}
	return d, nil
}

// Supports implements sluice.Store: the store computes in 64-bit
// integers (bigint), as NewLimit's bounds assume, so it takes every limit.
func (s *Store) Supports(*sluice.Limit) error { return nil }

// TakeAll implements sluice.Store. The takes run in one transaction (a
// savepoint inside a caller's), sent as one batch in the order of their
// storage keys, which is the order every TakeAll locks rows in; when any
// rejects, the transaction is rolled back and nothing is charged, also
// when a later take then fails (the rejection stands; see takeAll).
// Refunds run the same way and always commit.
func (s *Store) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, _ []sluice.Decision) ([]sluice.Decision, error) {
	if len(rs) == 0 {
		return []sluice.Decision{}, nil
	}
	var ds []sluice.Decision
	err := s.guarded(ctx, func(ctx context.Context) error {
		var err error
		ds, err = s.takeAll(ctx, op, rs)
		return err
	})
	if errors.Is(err, ErrBreakerOpen) {
		err = fmt.Errorf("postgres take all: %w", err)
	}
	return ds, err
}

// takeAll is TakeAll of rs under the breaker.
func (s *Store) takeAll(ctx context.Context, op engine.Op, rs []sluice.Charged) ([]sluice.Decision, error) {
	type item struct {
		i    int
		args []any
	}
	now := s.now()
	items := make([]item, len(rs))
	for i, r := range rs {
		items[i] = item{i: i, args: s.args(r, now)}
	}
	// Stable: the same bucket twice keeps its requests' order.
	slices.SortStableFunc(items, func(a, b item) int {
		return bytes.Compare(a.args[0].([]byte), b.args[0].([]byte))
	})
	dup := false
	for i := 1; i < len(items); i++ {
		dup = dup || bytes.Equal(items[i].args[0].([]byte), items[i-1].args[0].([]byte))
	}
	sql, params := opSQL(op)
	var tx pgx.Tx
	if sql == peekSQL && dup {
		// With the same bucket twice, the second peek must see the first's
		// charge: that is a take in a transaction that is always rolled
		// back.
		sql, params = takeSQL, 12
	}
	// Peeks change nothing and need no transaction; takes and refunds are
	// all-or-nothing.
	if sql != peekSQL {
		var err error
		if tx, err = s.q.Begin(ctx); err != nil {
			return nil, fmt.Errorf("postgres take all: begin: %w", err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
	}
	b := &pgx.Batch{}
	for _, it := range items {
		q, n := forWindow(rs[it.i].Limit, sql, params)
		b.Queue(q, it.args[:n]...)
	}
	out := make([]engine.Outcome, len(rs))
	var br pgx.BatchResults
	if tx != nil {
		br = tx.SendBatch(ctx, b)
	} else {
		br = s.q.SendBatch(ctx, b)
	}
	all := true
	answered := len(items) // the takes answered, in items' order
	for k, it := range items {
		o := &out[it.i]
		if err := br.QueryRow().Scan(&o.Allowed, &o.Tokens, &o.RetryAfter, &o.ResetAfter); err != nil {
			br.Close()
			if op != engine.OpTake || all {
				return nil, fmt.Errorf("postgres take all %q: %w", it.args[0], err)
			}
			// A take already rejected stays rejected: the transaction,
			// rolled back, charges nothing whatever the rest would have
			// answered. Answering the error instead would let a store
			// error policy (on_store_error: allow) admit a request over
			// its limit whenever a later row's lock is held past the
			// deadline, as a flood on a shared limit holds it. The takes
			// not answered are reported rejected with nothing known of
			// their buckets (an empty Outcome: no wait, which
			// sluice.Combine never picks over the known rejection's).
			answered = k
			break
		}
		all = all && o.Allowed
	}
	if answered == len(items) {
		if err := br.Close(); err != nil {
			return nil, fmt.Errorf("postgres take all: %w", err)
		}
	}
	for _, it := range items[answered:] {
		out[it.i] = engine.Outcome{}
	}
	ds := make([]sluice.Decision, len(rs))
	for i, r := range rs {
		if !all {
			if k := slices.IndexFunc(items, func(it item) bool { return it.i == i }); op == engine.OpTake && !out[i].Allowed && k < answered {
				s.recordViolation(ctx, items[k].args[0].([]byte), r.Limit.Decide(out[i]))
			}
			out[i].Allowed = false
		}
		ds[i] = r.Limit.Decide(out[i])
	}
	// A refund is always allowed, so every refund commits.
	if all && (op == engine.OpTake || op == engine.OpRefund) {
		if err := tx.Commit(ctx); err != nil {
			return nil, fmt.Errorf("postgres take all: commit: %w", err)
		}
	}
	return ds, nil
}

// Reset implements sluice.Store.
func (s *Store) Reset(ctx context.Context, l *sluice.Limit, key string) error {
	if l == nil {
		return fmt.Errorf("postgres reset %q: %w", key, sluice.ErrInvalidLimit)
	}
	k := s.rowKey(l, key)
	err := s.guarded(ctx, func(ctx context.Context) error {
		_, err := s.q.Exec(ctx, "DELETE FROM sluice_buckets WHERE key = $1", k)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres reset %q: %w", k, err)
	}
	return nil
}

// recordViolation queues a rejection for the violations table, with the
// user, client and endpoint when the caller put them in ctx (see
// sluice.WithCaller).
func (s *Store) recordViolation(ctx context.Context, key []byte, d sluice.Decision) {
	if s.opts.Violations == nil {
		return
	}
	v := Violation{BucketKey: string(key), Rule: d.Rule, Tokens: d.Tokens, At: s.wallNow()}
	if c, ok := sluice.CallerFrom(ctx); ok {
		v.UserID, v.IP, v.Endpoint = c.User, c.IP, c.Endpoint
	}
	s.opts.Violations.Record(v)
}

// Len returns the number of rows under the store's key prefix.
func (s *Store) Len(ctx context.Context) (int64, error) {
	var n int64
	err := s.q.QueryRow(ctx, "SELECT count(*) FROM sluice_buckets WHERE "+hasPrefix("$1"), []byte(s.opts.KeyPrefix)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("postgres len: %w", err)
	}
	return n, nil
}

// housekeepSQL deletes one batch of full buckets, skipping rows a transaction
// holds, for which it waited holding those it had deleted (TestAttackHousekeepingHoldsFullBuckets);
// the outer condition is re-checked, so a row a take just charged stays.
var housekeepSQL = `DELETE FROM sluice_buckets
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM sluice_buckets
    WHERE full_at <= coalesce($1::bigint, ` + clockSQL + `) AND ` + hasPrefix("$2") + `
    LIMIT $3::int FOR UPDATE SKIP LOCKED))
  AND full_at <= coalesce($1::bigint, ` + clockSQL + `) AND ` + hasPrefix("$2")

// hasPrefix is the SQL condition "key starts with the bytea parameter p".
func hasPrefix(p string) string {
	return "(octet_length(" + p + "::bytea) = 0 OR substring(key FROM 1 FOR octet_length(" + p + "::bytea)) = " + p + "::bytea)"
}

// Housekeep deletes the rows of buckets that have refilled (and are
// therefore equivalent to absent rows), one batch per statement so that
// no statement holds many row locks, until a batch comes back short. It
// returns the number of rows deleted. Expired shared values (LoadValue)
// go the same way.
func (s *Store) Housekeep(ctx context.Context) (int64, error) {
	total, err := s.deleteBatches(ctx, housekeepSQL, "housekeeping")
	if err != nil {
		return total, err
	}
	n, err := s.deleteBatches(ctx, housekeepValuesSQL, "housekeeping values")
	return total + n, err
}

// deleteBatches runs sql, a delete of one batch of rows under the store's
// prefix (housekeepSQL, housekeepValuesSQL), until a batch comes back
// short, and returns the number of rows deleted.
func (s *Store) deleteBatches(ctx context.Context, sql, what string) (int64, error) {
	var total int64
	for {
		tag, err := s.q.Exec(ctx, sql, s.now(), []byte(s.opts.KeyPrefix), s.opts.HousekeepingBatch)
		if err != nil {
			return total, fmt.Errorf("postgres %s: %w", what, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(s.opts.HousekeepingBatch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

func (s *Store) housekeeping() {
	defer close(s.done)
	t := time.NewTicker(s.opts.HousekeepingInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.HousekeepingInterval)
			// A failed pass is retried at the next tick; the rows it left
			// change no answer.
			if _, err := s.Housekeep(ctx); err != nil {
				s.opts.Logger.Warn("postgres: housekeeping failed", "err", err)
			}
			cancel()
		}
	}
}

var _ sluice.Store = (*Store)(nil)
