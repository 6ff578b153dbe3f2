package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Errors that say the server cannot serve now count against it; errors
// about the statement do not.
func TestServerAnswered(t *testing.T) {
	for code, want := range map[string]bool{
		"55P03": false, // lock_not_available: lock_timeout
		"53300": false, // too_many_connections
		"57P01": false, // admin_shutdown
		"57P03": false, // cannot_connect_now
		"57014": false, // query_canceled
		"08006": false, // connection_failure
		"25006": false, // read_only_sql_transaction: a standby
		"40P01": false, // deadlock_detected
		"22003": true,  // numeric_value_out_of_range: the input
		"23505": true,  // unique_violation
		"42883": true,  // undefined_function: a missing migration
		"P0001": true,  // raise_exception
	} {
		err := fmt.Errorf("postgres take: %w", &pgconn.PgError{Code: code})
		if got := serverAnswered(err); got != want {
			t.Errorf("%s: serverAnswered %v, want %v", code, got, want)
		}
	}
	for _, err := range []error{context.DeadlineExceeded, errors.New("dial tcp: connection refused")} {
		if serverAnswered(err) {
			t.Errorf("%v: serverAnswered true, want false", err)
		}
	}
}
