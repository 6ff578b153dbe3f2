package postgres

import (
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// Sliding windows and calendar windows run sluice_window_step (migration
// 0010), a port of package engine's functions, with statements of their
// own: $1 key, $2 algorithm, $3 the unit the row records (unit: a
// calendar window's capacity, 0 for a sliding window), $4 the test
// clock's time or NULL, $5 cost, $6 capacity, $7 period, $8 a calendar
// window's five bounds (engine.Windows, computed here, where the
// time-zone database is) or NULL.
const windowStep = `$5::bigint, %s, $6::bigint, $7::bigint, $8::bigint[]`

// calendarConvertSQL is row t's a for the request's limit:
// engine.ConvertWindow for a calendar window written under another
// capacity than $3, which keeps what the window used (a calendar window
// holds no debt); t.a as it is otherwise. As for a fixed window
// (convertedSQL), the row is written only by an admitted take or a refund.
const calendarConvertSQL = `CASE WHEN t.den = $3::bigint OR $2::smallint <> 1 OR t.a < 0 THEN t.a
        WHEN t.den <= 0 THEN least(t.a, $6::bigint)
        ELSE greatest(0, least(t.a, t.den) - t.den + $6::bigint) END`

var (
	takeWindowSQL = `INSERT INTO sluice_buckets AS t
    (key, alg, den, a, b, log_at, log_cost, full_at, at, o_allowed, o_tokens, o_retry, o_reset)
SELECT $1::bytea, $2::smallint, $3::bigint, s.a, s.b, s.log_at, s.log_cost, c.now + s.reset, c.now,
    s.allowed, s.tokens, s.retry, s.reset
FROM (SELECT coalesce($4::bigint, ` + clockSQL + `) AS now) c
CROSS JOIN LATERAL sluice_window_step(false, $2::smallint, 0, 0, NULL, c.now, ` + fmt.Sprintf(windowStep, "true, false") + `) s
ON CONFLICT (key) DO UPDATE SET
    (alg, den, a, b, log_at, log_cost, full_at, at, o_allowed, o_tokens, o_retry, o_reset) = (
    SELECT
        CASE WHEN s.write THEN EXCLUDED.alg ELSE t.alg END,
        CASE WHEN s.write THEN EXCLUDED.den ELSE t.den END,
        CASE WHEN s.write THEN s.a ELSE t.a END,
        CASE WHEN s.write THEN s.b ELSE t.b END,
        CASE WHEN s.write THEN s.log_at ELSE t.log_at END,
        CASE WHEN s.write THEN s.log_cost ELSE t.log_cost END,
        CASE WHEN s.write THEN EXCLUDED.at + s.reset ELSE t.full_at END,
        EXCLUDED.at, s.allowed, s.tokens, s.retry, s.reset
    FROM sluice_window_step(t.alg = EXCLUDED.alg, EXCLUDED.alg, ` + calendarConvertSQL + `, t.b, t.log_cost, EXCLUDED.at, ` + fmt.Sprintf(windowStep, "true, false") + `) s)
RETURNING o_allowed, o_tokens, o_retry, o_reset`

	refundWindowSQL = refundOf(`sluice_window_step(true, t.alg, `+calendarConvertSQL+`, t.b, t.log_cost, c.now, `+fmt.Sprintf(windowStep, "true, true")+`)`,
		`sluice_window_step(false, $2::smallint, 0, 0, NULL, c.now, `+fmt.Sprintf(windowStep, "true, true")+`)`)

	peekWindowSQL = peekOf(`sluice_window_step`, calendarConvertSQL+`, t.b, t.log_cost, c.now, `+fmt.Sprintf(windowStep, "false, false"))
)

// windowArgs are the statement parameters of a request to a sliding or
// calendar window (see windowStep).
func (s *Store) windowArgs(r sluice.Charged, now any) []any {
	p, ch := r.Limit.Params(), r.Charge
	var bounds any
	if p.Calendar != 0 {
		b := engine.Windows(p, s.wallNow().UnixMicro())
		bounds = b[:]
	}
	return []any{
		s.rowKey(r.Limit, r.Key), int16(p.Algorithm), unit(p), now,
		ch.Cost, p.Capacity, p.Period, bounds,
	}
}

// forWindow returns the statement that stands for sql (takeSQL, peekSQL
// or refundSQL) for a request to l, and its parameter count.
func forWindow(l *sluice.Limit, sql string, params int) (string, int) {
	if !l.Params().Windowed() {
		return sql, params
	}
	switch sql {
	case takeSQL:
		return takeWindowSQL, 8
	case refundSQL:
		return refundWindowSQL, 8
	}
	return peekWindowSQL, 8
}
