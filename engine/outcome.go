package engine

import "fmt"

// Charge is a Request in the integer form the algorithms take.
type Charge struct {
	Cost        int64 // micro-tokens
	Reserve     bool
	MaxReserved int64 // micro-tokens
}

// Op says whether a store call consumes tokens.
type Op uint8

// String returns "take", "peek", "refund", "renew" or "release": the
// name of op in metrics and errors.
func (op Op) String() string {
	if int(op) < len(opNames) {
		return opNames[op]
	}
	return fmt.Sprintf("op(%d)", uint8(op))
}

// LeaseString names op as a call on a concurrency limit's leases
// (Store.Lease): "acquire", "lease_peek", "release" or "renew", in
// metrics and errors.
func (op Op) LeaseString() string {
	if int(op) < len(leaseOpNames) && leaseOpNames[op] != "" {
		return leaseOpNames[op]
	}
	return fmt.Sprintf("lease_op(%d)", uint8(op))
}

// The names of the ops, in their order; a refund is no lease call.
var (
	opNames      = [...]string{"take", "peek", "refund", "renew", "release"}
	leaseOpNames = [...]string{"acquire", "lease_peek", "", "renew", "release"}
)

const (
	// OpTake charges admitted requests.
	OpTake Op = iota
	// OpPeek answers what a take would, consuming nothing.
	OpPeek
	// OpRefund gives Cost tokens back, never above the capacity, for a
	// request that was charged but not carried out (Envoy's negative
	// hits). A refund larger than one request can be charged gives back
	// that much (see sluice.Request.Charged). A key with no state is full and
	// stays so. Its Decision is allowed and describes the bucket after the
	// refund.
	OpRefund
	// OpRenew extends a concurrency limit's lease that is still live, and
	// never acquires a slot (Store.Lease only; see StepLease): what the
	// decision API's /v1/renew asks, where the caller has a lease id alone
	// and must not choose one.
	OpRenew
	// OpRelease gives a concurrency limit's slot back: lease id's slot is
	// freed (Store.Lease only; see StepLease). Tokens are refunded
	// (OpRefund); slots are released.
	OpRelease
)

// Outcome is an algorithm's answer in integers, the form every engine
// returns before it becomes a Decision.
type Outcome struct {
	Allowed bool
	// Tokens left after the decision, in micro-tokens; negative while a
	// reservation is in debt.
	Tokens int64
	// RetryAfter is the wait in microseconds: until a rejected request
	// would be admitted, or until an admitted reservation's turn.
	RetryAfter int64
	// ResetAfter is the wait in microseconds until the bucket is full.
	ResetAfter int64
}
