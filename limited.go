package sluice

import (
	"context"
	"fmt"
	"time"
)

// LimitedError is a rejection as an error, from TakeOrError and Wait:
//
//	var le *sluice.LimitedError
//	if errors.As(err, &le) { retry at le.RetryAt }
//
// errors.Is(err, ErrLimited) holds for every one.
type LimitedError struct {
	// Rule names the limit that rejected.
	Rule string
	// Key is the bucket's key.
	Key string
	// RetryAfter is how long to wait before asking again, the limit's
	// jitter included (Decision.RetryAfter).
	RetryAfter time.Duration
	// RetryAt is when RetryAfter ends on the Limiter's clock
	// (Decision.RetryAt).
	RetryAt time.Time

	cause error // ErrBeyondDeadline from Wait, else nil
}

// limited returns the *LimitedError of d, a rejection of r.
func limited(r Request, d Decision) *LimitedError {
	return &LimitedError{Rule: d.Rule, Key: r.Key, RetryAfter: d.RetryAfter, RetryAt: d.RetryAt}
}

func (e *LimitedError) Error() string {
	why := ""
	if e.cause != nil {
		why = ": " + e.cause.Error()
	}
	retry := ""
	if e.RetryAfter > 0 {
		retry = fmt.Sprintf("; retry after %v", e.RetryAfter)
		if !e.RetryAt.IsZero() {
			retry += " (at " + e.RetryAt.UTC().Format(RetryAtLayout) + ")"
		}
	}
	return fmt.Sprintf("sluice: rate limited by %q for key %q%s%s", e.Rule, e.Key, why, retry)
}

// Is makes every LimitedError ErrLimited.
func (e *LimitedError) Is(target error) bool { return target == ErrLimited }

// Unwrap returns why the error was returned beyond the rejection itself:
// ErrBeyondDeadline for Wait's, else nil.
func (e *LimitedError) Unwrap() error { return e.cause }

// RetryAtLayout is how a retry time is written: RFC 3339 with
// milliseconds, as the decision API's retry_at is.
const RetryAtLayout = "2006-01-02T15:04:05.000Z07:00"

// TakeOrError is Take for callers that treat a rejection as an error, as
// Go code treats most failures: a rejection returns a *LimitedError
// (errors.Is(err, ErrLimited)) beside the decision; an admit, a
// reservation included, returns a nil error and the decision, whose
// RetryAfter then says when the reserved turn comes. Other errors (a cost
// that can never succeed, a store failure) are Take's.
func (l *Limiter) TakeOrError(ctx context.Context, r Request) (Decision, error) {
	d, err := l.Take(ctx, r)
	if err == nil && !d.Allowed {
		return d, limited(r, d)
	}
	return d, err
}
