package sluice

import (
	"fmt"
	"math"
	"strconv"

	"github.com/sluicehq/sluice/engine"
)

// SpecError is a Spec that NewLimit refuses, with the field at fault. It
// matches ErrInvalidLimit (errors.Is). NewLimit is the one place that
// decides which limits are valid: a configuration file's algorithm_config
// is compiled by it and reports its SpecError at the line of Field.
type SpecError struct {
	// Limit is the Spec's name.
	Limit string
	// Field is the field at fault as a configuration file spells it
	// ("burst", "tokens_per_second", "rate", "capacity", "max_reserved"),
	// "" when no one field is.
	Field string
	// Reason says what is wrong, as a predicate of Field ("must be at
	// most ..."), or as a sentence when Field is "".
	Reason string
}

// Error reads `sluice: invalid limit "NAME": FIELD REASON`.
func (e *SpecError) Error() string {
	msg := e.Reason
	if e.Field != "" {
		msg = e.Field + " " + e.Reason
	}
	return fmt.Sprintf("%v %q: %s", ErrInvalidLimit, e.Limit, msg)
}

// Unwrap returns ErrInvalidLimit.
func (e *SpecError) Unwrap() error { return ErrInvalidLimit }

// maxAmount is the most tokens a capacity, rate or cost may be: 2^53
// micro-tokens, written out ("9007199254.740992").
var maxAmount = strconv.FormatFloat(float64(engine.MaxMicroTokens)/engine.TokenScale, 'f', -1, 64)

// amountReason converts v, a size or rate of a Spec already known to be a
// finite number > 0, to micro-tokens, or says why it is out of the range
// every store counts exactly, as a predicate of the field it was given in.
func amountReason(v float64) (int64, string) {
	m, err := engine.ToMicroTokens(v)
	switch {
	case err == nil:
		return m, ""
	case v > 1:
		return 0, fmt.Sprintf("must be at most %s (2^53 micro-tokens, the most every store counts exactly), got %v", maxAmount, v)
	}
	return 0, fmt.Sprintf("must be at least 0.000001 (one micro-token, the least every store counts), got %v", v)
}

// costError is a cost that Request.Charged refuses. Its message says what
// is wrong with the cost, and only that; it matches its sentinel
// (ErrInvalidCost or ErrCostExceedsLimit) with errors.Is.
type costError struct {
	msg  string
	kind error
}

func (e *costError) Error() string { return e.msg }
func (e *costError) Unwrap() error { return e.kind }

// costAbove is the error of a take of cost on limit name that is above
// what, the most it can ever be charged ("the capacity (10)"): no wait
// would admit it. A cost too large to count, infinity included, is above
// every capacity too, and is said so.
func costAbove(name string, cost float64, what string) error {
	return &costError{fmt.Sprintf("limit %q: cost %v is above %s: it can never succeed", name, cost, what), ErrCostExceedsLimit}
}

// costInvalid is the error of a cost that is no amount of tokens at all:
// not a number, negative, or below one micro-token.
func costInvalid(name string, cost float64) error {
	why := "must be a number > 0"
	if cost > 0 && !math.IsInf(cost, 1) {
		why = "is below one micro-token (0.000001), the least every store counts"
	}
	return &costError{fmt.Sprintf("limit %q: cost %v %s", name, cost, why), ErrInvalidCost}
}
