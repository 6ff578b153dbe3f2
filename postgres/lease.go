package postgres

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// The statements of concurrency limits (migrations 0007 and 0009): a key's leases
// are its row's lease_ids and log_at, decided by sluice_lease. Parameters:
// $1 key, $2 alg (sluice.Concurrency), $3 the test clock or NULL, $4 op,
// $5 lease id, $6 slots, $7 lease length in microseconds.
const leaseArgs = `$4::text, $5::uuid, $6::bigint, $7::bigint`

var (
	// acquireSQL is one statement, like a take: the row is locked by the
	// conflict, so concurrent acquires of one key are decided one after
	// another on its newest version. A row of another shape under the key
	// counts as absent and is replaced.
	acquireSQL = `INSERT INTO sluice_buckets AS t
    (key, alg, den, a, b, log_at, log_cost, lease_ids, full_at, at, o_allowed, o_tokens, o_retry, o_reset)
SELECT $1::bytea, $2::smallint, 0, 0, 0, s.ends, NULL::bigint[], s.ids, c.now + s.reset, c.now,
    s.allowed, s.tokens, s.retry, s.reset
FROM (SELECT coalesce($3::bigint, ` + clockSQL + `) AS now) c
CROSS JOIN LATERAL sluice_lease(false, NULL, NULL, c.now, ` + leaseArgs + `) s
ON CONFLICT (key) DO UPDATE SET
    (alg, den, a, b, log_at, log_cost, lease_ids, full_at, at, o_allowed, o_tokens, o_retry, o_reset) = (
    SELECT EXCLUDED.alg, 0, 0, 0, s.ends, NULL::bigint[], s.ids, EXCLUDED.at + s.reset, EXCLUDED.at,
        s.allowed, s.tokens, s.retry, s.reset
    FROM sluice_lease(t.alg = EXCLUDED.alg, t.lease_ids, t.log_at, EXCLUDED.at, ` + leaseArgs + `) s)
RETURNING o_allowed, o_tokens, o_retry, o_reset`

	// updateSQL, for a release or a renewal, updates the key's row and
	// inserts none: a key without a row holds no lease. When it updates
	// nothing, the second branch answers for the absent key.
	updateSQL = `WITH c AS MATERIALIZED (SELECT coalesce($3::bigint, ` + clockSQL + `) AS now),
u AS (
    UPDATE sluice_buckets AS t SET
        (log_at, lease_ids, full_at, at, o_allowed, o_tokens, o_retry, o_reset) = (
        SELECT s.ends, s.ids, c.now + s.reset, c.now, s.allowed, s.tokens, s.retry, s.reset
        FROM c CROSS JOIN LATERAL sluice_lease(true, t.lease_ids, t.log_at, c.now, ` + leaseArgs + `) s)
    WHERE t.key = $1::bytea AND t.alg = $2::smallint
    RETURNING t.o_allowed, t.o_tokens, t.o_retry, t.o_reset)
SELECT o_allowed, o_tokens, o_retry, o_reset FROM u
UNION ALL
SELECT s.allowed, s.tokens, s.retry, s.reset
FROM c CROSS JOIN LATERAL sluice_lease(false, NULL, NULL, c.now, ` + leaseArgs + `) s
WHERE NOT EXISTS (SELECT FROM u)`

	leasePeekSQL = `SELECT s.allowed, s.tokens, s.retry, s.reset
FROM (SELECT coalesce($3::bigint, ` + clockSQL + `) AS now) c
LEFT JOIN sluice_buckets t ON t.key = $1::bytea
CROSS JOIN LATERAL sluice_lease(coalesce(t.alg = $2::smallint, false), t.lease_ids, t.log_at, c.now, ` + leaseArgs + `) s`
)

// Lease implements sluice.Store for concurrency limits: one statement per
// call, on the server's clock, atomic under READ COMMITTED. A rejected
// acquire is recorded in the violation log like a rejected take.
func (s *Store) Lease(ctx context.Context, op engine.Op, r sluice.Request, id engine.LeaseID) (sluice.Decision, error) {
	if err := r.CheckLease(); err != nil {
		return sluice.Decision{}, err
	}
	p := r.Limit.Params()
	key := s.rowKey(r.Limit, r.Key)
	sql, letter, what := leasePeekSQL, "p", "lease peek"
	switch op {
	case engine.OpTake:
		sql, letter, what = acquireSQL, "t", "acquire"
	case engine.OpRelease:
		sql, letter, what = updateSQL, "r", "release"
	case engine.OpRenew:
		sql, letter, what = updateSQL, "n", "renew"
	}
	var o engine.Outcome
	err := s.guarded(ctx, func(ctx context.Context) error {
		return s.q.QueryRow(ctx, sql, key, int16(sluice.Concurrency), s.now(), letter, id.String(), p.Capacity/engine.TokenScale, p.Period).
			Scan(&o.Allowed, &o.Tokens, &o.RetryAfter, &o.ResetAfter)
	})
	if err != nil {
		return sluice.Decision{}, fmt.Errorf("postgres %s %q: %w", what, key, err)
	}
	d := r.Limit.Decide(o)
	if !d.Allowed && op == engine.OpTake {
		s.recordViolation(ctx, key, d)
	}
	return d, nil
}
