package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/defaults"
	"github.com/sluicehq/sluice/policy"
)

// Violation is one rejected request.
type Violation struct {
	ID        int64 // set when read back
	BucketKey string
	UserID    string     // "" when unknown
	IP        netip.Addr // invalid when unknown
	Endpoint  string
	At        time.Time
	Tokens    float64 // tokens in the bucket when the request was rejected
	Rule      string
	RuleID    int64 // the sluice_rules row, or 0
}

// ViolationOptions configures a ViolationLog.
type ViolationOptions struct {
	// QueueSize bounds the violations waiting to be written (default
	// 10000); when it is full new ones are dropped and counted, so that a
	// slow database never slows the requests being limited.
	QueueSize int
	// BatchSize is the most rows one COPY writes (default 500).
	BatchSize int
	// FlushInterval is the longest a violation waits for its batch to fill
	// (default one second).
	FlushInterval time.Duration
	// PerBucket is the interval in which a bucket's rejections are
	// recorded once (default one second): its first rejection is queued,
	// the others within the interval are counted in Coalesced, so that a
	// client flooding a limit it is over writes a row a second rather than
	// one a request. Intervals are aligned to the Unix epoch and judged by
	// the violations' At. Negative records every rejection.
	PerBucket time.Duration
	// Retention is how long rows of sluice_violations are kept (default
	// seven days): the log deletes older ones at start and every minute
	// after, in batches (Expire). Negative keeps them for ever.
	Retention time.Duration
	// Logger reports failed writes and deletes (default slog.Default()).
	Logger *slog.Logger
}

// Expiry's pace: how often the log deletes rows past their retention,
// the most rows one DELETE removes (which bounds how long it holds row
// locks), and the deadline of each DELETE.
const (
	retentionInterval = time.Minute
	expireBatch       = 1000
	expireTimeout     = 10 * time.Second
)

// ViolationLog writes violations to sluice_violations off the request
// path: Record queues without blocking and one goroutine writes the queue
// in batches with COPY. Another deletes the rows past their retention.
type ViolationLog struct {
	pool    *pgxpool.Pool
	opts    ViolationOptions
	queue   chan Violation
	flushed chan chan struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	// expiring ends with the retention goroutine's pass in flight, at
	// Close; expired is closed when that goroutine has returned.
	expiring  context.Context
	endExpiry context.CancelFunc
	expired   chan struct{}

	ruleIDs atomic.Pointer[map[string]int64] // limit name -> sluice_rules row

	// seen holds the bucket keys recorded in interval (At divided by
	// PerBucket). It holds at most QueueSize keys: one more starts a new
	// map, so that a flood of distinct keys bounds its memory, and a key
	// recorded before then may be recorded once more, which a client can
	// only buy with QueueSize rows of other buckets.
	mu       sync.Mutex
	interval int64
	seen     map[string]struct{}

	// The counts that Dropped, Written, Failed and Coalesced read, and
	// that package metrics exports (metrics.NewViolationLogCollector).
	dropped, written, failed, coalesced atomic.Uint64
}

// violationColumns are the columns COPY fills, in order.
var violationColumns = []string{"bucket_key", "user_id", "ip_address", "endpoint", "requested_at", "tokens_at_time", "rule", "rule_id"}

// NewViolationLog starts a log writing through pool. Close it to write
// what is queued.
func NewViolationLog(pool *pgxpool.Pool, opts ViolationOptions) (*ViolationLog, error) {
	defaults.Set(&opts.QueueSize, 10000)
	defaults.Set(&opts.BatchSize, 500)
	defaults.Set(&opts.FlushInterval, time.Second)
	opts.PerBucket = cmp.Or(opts.PerBucket, time.Second)
	opts.Retention = cmp.Or(opts.Retention, 7*24*time.Hour)
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	v := &ViolationLog{
		pool: pool, opts: opts,
		queue:   make(chan Violation, opts.QueueSize),
		flushed: make(chan chan struct{}),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		expired: make(chan struct{}),
		seen:    map[string]struct{}{},
	}
	v.expiring, v.endExpiry = context.WithCancel(context.Background())
	go v.run()
	if opts.Retention > 0 {
		go v.expireLoop()
	} else {
		close(v.expired)
	}
	return v, nil
}

// Record queues x for writing and reports whether it was queued: a
// rejection of a bucket already recorded within the current PerBucket
// interval is not (counted in Coalesced), and a full queue drops it
// (counted in Dropped); both are exported as metrics. It never blocks.
// A zero At is the current time.
func (v *ViolationLog) Record(x Violation) bool {
	if x.At.IsZero() {
		x.At = time.Now()
	}
	if v.opts.PerBucket > 0 && !v.first(x) {
		v.coalesced.Add(1)
		return false
	}
	if x.RuleID == 0 {
		if ids := v.ruleIDs.Load(); ids != nil {
			x.RuleID = (*ids)[x.Rule]
		}
	}
	select {
	case v.queue <- x:
		return true
	default:
		v.dropped.Add(1)
		return false
	}
}

// first reports whether x is its bucket's first violation in its
// PerBucket interval, and notes it. A violation of an earlier interval
// than the last one seen (a clock stepped back, or a caller's At a
// moment older than another's at a boundary) starts a new one too: the
// cost is a row more, where keeping the later interval would record
// nothing until the clock caught up with it.
func (v *ViolationLog) first(x Violation) bool {
	interval := x.At.UnixNano() / int64(v.opts.PerBucket)
	v.mu.Lock()
	defer v.mu.Unlock()
	if interval != v.interval {
		v.newInterval(interval)
	} else if _, ok := v.seen[x.BucketKey]; ok {
		return false
	} else if len(v.seen) >= v.opts.QueueSize {
		v.newInterval(interval)
	}
	v.seen[x.BucketKey] = struct{}{}
	return true
}

// newInterval forgets the buckets seen, with a fresh map rather than
// clear: a flood of keys would otherwise leave its buckets' memory behind.
func (v *ViolationLog) newInterval(interval int64) {
	v.interval, v.seen = interval, make(map[string]struct{}, min(len(v.seen), 64))
}

// SetRuleIDs tells the log which sluice_rules row each limit name came
// from (RuleIDs): Record fills a violation's RuleID from it when the
// caller left it 0. A PolicySource given the log calls it on every reload.
func (v *ViolationLog) SetRuleIDs(ids map[string]int64) { v.ruleIDs.Store(&ids) }

// Dropped returns how many violations were dropped on a full queue.
func (v *ViolationLog) Dropped() uint64 { return v.dropped.Load() }

// Written returns how many violations were written.
func (v *ViolationLog) Written() uint64 { return v.written.Load() }

// Failed returns how many violations were lost to failed writes.
func (v *ViolationLog) Failed() uint64 { return v.failed.Load() }

// Coalesced returns how many violations were not recorded because their
// bucket's was within the same PerBucket interval.
func (v *ViolationLog) Coalesced() uint64 { return v.coalesced.Load() }

// Flush writes everything queued before it was called, or returns when ctx
// ends.
func (v *ViolationLog) Flush(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case v.flushed <- ack:
	case <-v.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close writes what is queued and stops the writer, and the deleting of
// expired rows.
func (v *ViolationLog) Close() {
	v.once.Do(func() {
		close(v.stop)
		v.endExpiry()
	})
	<-v.done
	<-v.expired
}

// expireSQL deletes one batch of rows older than $1, skipping rows a
// transaction holds (TestAttackHousekeepingHoldsFullBuckets tells why a
// delete must not wait for them), through the index on requested_at.
const expireSQL = `DELETE FROM sluice_violations
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM sluice_violations
    WHERE requested_at < $1
    LIMIT $2::int FOR UPDATE SKIP LOCKED))
  AND requested_at < $1`

// Expire deletes the rows of sluice_violations older than Retention, one
// batch per statement, each within its own deadline, until a batch comes
// back short, and returns how many it deleted. With Retention negative
// it deletes nothing. The log runs it at start and every minute after;
// rows of all the processes writing the table go, whichever runs it.
func (v *ViolationLog) Expire(ctx context.Context) (int64, error) {
	if v.opts.Retention <= 0 {
		return 0, nil
	}
	cutoff := time.Now().Add(-v.opts.Retention)
	var total int64
	for {
		sctx, cancel := context.WithTimeout(ctx, expireTimeout)
		tag, err := v.pool.Exec(sctx, expireSQL, cutoff, expireBatch)
		cancel()
		if err != nil {
			return total, fmt.Errorf("postgres violations: deleting rows older than %v: %w", v.opts.Retention, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < expireBatch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("postgres violations: deleting rows older than %v: %w", v.opts.Retention, err)
		}
	}
}

func (v *ViolationLog) expireLoop() {
	defer close(v.expired)
	t := time.NewTicker(retentionInterval)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(v.expiring, retentionInterval)
		// A failed pass is retried at the next tick: the rows it left are
		// only older.
		if _, err := v.Expire(ctx); err != nil && v.expiring.Err() == nil {
			v.opts.Logger.Warn("postgres: deleting expired violations failed", "err", err)
		}
		cancel()
		select {
		case <-v.expiring.Done():
			return
		case <-t.C:
		}
	}
}

func (v *ViolationLog) run() {
	defer close(v.done)
	batch := make([]Violation, 0, v.opts.BatchSize)
	t := time.NewTicker(v.opts.FlushInterval)
	defer t.Stop()
	drain := func() {
		for len(batch) < v.opts.BatchSize {
			select {
			case x := <-v.queue:
				batch = append(batch, x)
			default:
				return
			}
		}
	}
	writeAll := func() {
		for {
			drain()
			if batch = v.write(batch); len(v.queue) == 0 {
				return
			}
		}
	}
	for {
		select {
		case x := <-v.queue:
			batch = append(batch, x)
			drain()
			if len(batch) >= v.opts.BatchSize {
				batch = v.write(batch)
			}
		case <-t.C:
			batch = v.write(batch)
		case ack := <-v.flushed:
			writeAll()
			close(ack)
		case <-v.stop:
			writeAll()
			return
		}
	}
}

// write copies batch into the table and returns it emptied.
func (v *ViolationLog) write(batch []Violation) []Violation {
	if len(batch) == 0 {
		return batch
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows := make([][]any, len(batch))
	for i, x := range batch {
		// Client-supplied text must not fail the whole batch: the columns
		// take valid UTF-8 without NUL, and three have a length limit.
		rows[i] = []any{clean(x.BucketKey, 256), orNull(clean(x.UserID, maxUserID)), orNull(x.IP), orNull(clean(x.Endpoint, 255)), x.At, x.Tokens, clean(x.Rule, 0), orNull(x.RuleID)}
	}
	n, err := v.pool.CopyFrom(ctx, pgx.Identifier{"sluice_violations"}, violationColumns, pgx.CopyFromRows(rows))
	if err != nil {
		v.failed.Add(uint64(len(batch)))
		v.opts.Logger.Warn("postgres: writing violations failed", "rows", len(batch), "err", err)
	} else {
		v.written.Add(uint64(n))
	}
	clear(batch)
	return batch[:0]
}

// maxUserID bounds a user id in characters, so that user_id's index
// (which refuses rows of 2704 bytes, failing the batch) takes it.
const maxUserID = 512

// clean makes s storable in a text column: invalid UTF-8 and NUL become
// U+FFFD, and it is cut to max characters when max > 0.
func clean(s string, max int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if max > 0 && utf8.RuneCountInString(s) > max {
		s = string([]rune(s)[:max])
	}
	return s
}

// orNull is v, or SQL NULL for v's zero value (an invalid address).
func orNull[T comparable](v T) any {
	if v == *new(T) {
		return nil
	}
	return v
}

// ViolationQuery selects violations for ListViolations.
type ViolationQuery struct {
	Since time.Time // only violations at or after Since
	// UserID selects one user's violations (by the by-user index): the
	// user a server named with sluice.WithCaller, which sluice serve sets
	// to the verified JWT subject and to nothing else.
	UserID string
	IP     netip.Addr // only this client's, when valid (uses the by-IP index)
	// Key selects the buckets keyed by a value: one a limit_keys source
	// (header, query parameter, claim) held, as the client sent it
	// ("alice" for X-User: alice; escaped as policy.KeyComponent does),
	// which is one of the |-separated components of a bucket key, or a
	// whole bucket key as stored. It reads every violation since Since.
	Key   string
	Limit int // at most this many (default 100)
}

// ErrNotMigrated reports a database without sluice's tables, or with
// tables older than the violations table: run the migrations
// (postgres.Migrate, sluice migrate).
var ErrNotMigrated = errors.New("the database has no sluice tables")

// Queryer is what ListViolations needs: a pool, a connection or a
// transaction.
type Queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ListViolations returns the violations q selects, newest first.
func ListViolations(ctx context.Context, db Queryer, q ViolationQuery) ([]Violation, error) {
	defaults.Set(&q.Limit, 100)
	sql := `SELECT violation_id, bucket_key, coalesce(user_id, ''), ip_address, coalesce(endpoint, ''),
       requested_at, tokens_at_time, rule, coalesce(rule_id, 0)
FROM sluice_violations WHERE requested_at >= $1`
	args := []any{q.Since, q.Limit}
	if q.UserID != "" {
		args = append(args, clean(q.UserID, maxUserID))
		sql += fmt.Sprintf(" AND user_id = $%d", len(args))
	}
	if q.IP.IsValid() {
		args = append(args, q.IP)
		sql += fmt.Sprintf(" AND ip_address = $%d", len(args))
	}
	if q.Key != "" {
		// A component ends the key or a '|' follows it, and a ':' (the
		// end of the limit's name) or a '|' precedes it: escaped
		// components contain neither, so no other value matches. The
		// shard tag of a sharded limit (":{N}" after the name, see
		// sluice.Limit.ShardKey) is read as the ':' alone.
		args = append(args, q.Key, keyComponents(q.Key))
		sql += fmt.Sprintf(` AND (bucket_key = $%d OR EXISTS (SELECT FROM unnest($%d::text[]) c,
         LATERAL (SELECT regexp_replace(bucket_key, ':\{[0-9]+\}', ':') AS k) b
       WHERE right(b.k, length(c) + 1) IN (':' || c, '|' || c)
          OR strpos(b.k, ':' || c || '|') > 0 OR strpos(b.k, '|' || c || '|') > 0))`, len(args)-1, len(args))
	}
	sql += " ORDER BY requested_at DESC, violation_id DESC LIMIT $2"
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, listError(err)
	}
	defer rows.Close()
	var out []Violation
	for rows.Next() {
		var x Violation
		var ip *netip.Prefix
		if err := rows.Scan(&x.ID, &x.BucketKey, &x.UserID, &ip, &x.Endpoint, &x.At, &x.Tokens, &x.Rule, &x.RuleID); err != nil {
			return nil, fmt.Errorf("postgres violations: %w", err)
		}
		if ip != nil {
			x.IP = ip.Addr()
		}
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, listError(err)
	}
	return out, nil
}

// keyComponents returns the forms v takes as a component of a bucket key:
// escaped, as a header's, query parameter's or claim's value is, and, for
// an address or a prefix, as ip:address writes it (not escaped) and as a
// remote_address descriptor's value is (escaped); an IPv6 address as its
// prefix (policy.AddressKey, by the default ipv6_prefix), as both key it.
func keyComponents(v string) []string {
	cs := []string{policy.KeyComponent(v)}
	if a, err := netip.ParseAddr(v); err == nil {
		k := policy.AddressKey(a, policy.DefaultSettings().IPv6Prefix)
		cs = append(cs, a.Unmap().String(), k, policy.KeyComponent(k))
	} else if p, err := netip.ParsePrefix(v); err == nil {
		cs = append(cs, p.Masked().String(), policy.KeyComponent(p.Masked().String()))
	}
	return cs
}

// listError wraps a failed read, as ErrNotMigrated when the table is
// missing (SQLSTATE 42P01, undefined_table).
func listError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("postgres violations: %w (%s)", ErrNotMigrated, pgErr.Message)
	}
	return fmt.Errorf("postgres violations: %w", err)
}
