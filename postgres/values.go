package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/adaptive"
)

// Small values every process of a fleet shares besides bucket state: the
// adaptive rates (package adaptive's Values), in the table sluice_values.
// A read is one SELECT and a compare-and-swap one statement, so that two
// processes stepping the same rate at once never both win: under READ
// COMMITTED the loser's statement waits for the winner's row and finds
// its condition false on the new version. A row past its expiry is
// absent to both, whatever housekeeping has yet to delete.

// nowSQL is the statement's time: the test clock's ($n) or the server's.
func nowSQL(n string) string { return "coalesce(" + n + "::bigint, " + clockSQL + ")" }

var (
	loadValueSQL = `SELECT value FROM sluice_values WHERE key = $1::bytea AND expires_at > ` + nowSQL("$2")

	// createValueSQL writes a value where there is none, or only an
	// expired one; EXCLUDED.expires_at less the TTL is the statement's
	// one clock reading.
	createValueSQL = `INSERT INTO sluice_values AS t (key, value, expires_at)
SELECT $1::bytea, $2::text, c.now + $3::bigint FROM (SELECT ` + nowSQL("$4") + ` AS now) c
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
WHERE t.expires_at <= EXCLUDED.expires_at - $3::bigint`

	swapValueSQL = `UPDATE sluice_values SET value = $2::text, expires_at = ` + nowSQL("$4") + ` + $3::bigint
WHERE key = $1::bytea AND value = $5::text AND expires_at > ` + nowSQL("$4")

	// housekeepValuesSQL deletes one batch of expired values, as
	// housekeepSQL does full buckets.
	housekeepValuesSQL = `DELETE FROM sluice_values
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM sluice_values
    WHERE expires_at <= ` + nowSQL("$1") + ` AND ` + hasPrefix("$2") + `
    LIMIT $3::int FOR UPDATE SKIP LOCKED))
  AND expires_at <= ` + nowSQL("$1") + ` AND ` + hasPrefix("$2")
)

// LoadValue returns the value kept under key (after Options.KeyPrefix);
// ok is false when there is none or it has expired.
func (s *Store) LoadValue(ctx context.Context, key string) (string, bool, error) {
	k := s.opts.KeyPrefix + key
	var v string
	found := true
	err := s.guarded(ctx, func(ctx context.Context) error {
		err := s.q.QueryRow(ctx, loadValueSQL, []byte(k), s.now()).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			found = false
			return nil
		}
		return err
	})
	if err != nil {
		return "", false, fmt.Errorf("postgres load value %q: %w", k, err)
	}
	return v, found, nil
}

// CompareAndSwapValue stores value under key (after Options.KeyPrefix),
// to expire after ttl, if the key still holds old ("" for none, or an
// expired value), and reports whether it did.
func (s *Store) CompareAndSwapValue(ctx context.Context, key, old, value string, ttl time.Duration) (bool, error) {
	k := s.opts.KeyPrefix + key
	if value == "" {
		return false, errors.New("postgres compare-and-swap: an empty value reads as no value")
	}
	sql, args := createValueSQL, []any{[]byte(k), value, max(1, ttl.Microseconds()), s.now()}
	if old != "" {
		sql, args = swapValueSQL, append(args, old)
	}
	var tag pgconn.CommandTag
	err := s.guarded(ctx, func(ctx context.Context) (err error) {
		tag, err = s.q.Exec(ctx, sql, args...)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("postgres compare-and-swap %q: %w", k, err)
	}
	return tag.RowsAffected() == 1, nil
}

var _ adaptive.Values = (*Store)(nil)
