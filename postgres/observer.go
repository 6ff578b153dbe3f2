package postgres

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Observer is told of the store's events, for its metrics: package
// metrics implements it as Prometheus counters
// (metrics.NewPostgresObserver), which keeps Prometheus out of a program
// that uses this store without them. The store calls it on the request
// path: its methods must be cheap and must not block.
type Observer interface {
	// StoreError: a call to PostgreSQL failed (an error, a timeout, a
	// lock wait past lock_timeout, or a refusal by the open circuit
	// breaker). A call its caller cancelled is not counted.
	StoreError()
	// BreakerChanged: the circuit breaker is now in state (0 closed,
	// 1 open, 2 probing); opened is true when it has just opened.
	BreakerChanged(state int32, opened bool)
}

// noObserver is the Observer of a store opened without one.
type noObserver struct{}

func (noObserver) StoreError()                {}
func (noObserver) BreakerChanged(int32, bool) {}

// serverAnswered reports whether err, a failed call's error, says the
// server is there and serving, so that it counts as a success for the
// circuit breaker: an error about the statement or its input (a value
// out of range, a constraint) that the next call would not share. An
// error that says the server cannot serve now counts as a failure, as
// does any error that is not the server's (a connection refused or
// lost, a deadline):
//
//   - 08 connection exception, 53 insufficient resources (53300
//     too_many_connections, 53100 disk_full, 53200 out_of_memory), 58
//     system error (58030 io_error);
//   - 57 operator intervention: 57014 query_canceled (the deadline's
//     cancel, or statement_timeout), 57P01 admin_shutdown, 57P02
//     crash_shutdown, 57P03 cannot_connect_now (starting up, recovering);
//   - 55P03 lock_not_available: a row held locked by another session past
//     lock_timeout, which would hold the next call on that key as well;
//   - 25006 read_only_sql_transaction: a standby after a failover, or a
//     server in read-only mode, which cannot take;
//   - 40001 serialization_failure and 40P01 deadlock_detected: contention
//     the server resolved by failing this call.
func serverAnswered(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	code := pgErr.Code
	switch {
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"), strings.HasPrefix(code, "57"), strings.HasPrefix(code, "58"):
		return false
	}
	switch code {
	case "55P03", "25006", "40001", "40P01":
		return false
	}
	return true
}
