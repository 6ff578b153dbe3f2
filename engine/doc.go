// Package engine is what a sluice Store implements: every algorithm as
// pure integer arithmetic on one key's state and the time, with no I/O and
// no clock of its own. Application code needs none of it (package sluice
// is the application's); a new store needs all of it, and this page is its
// contract.
//
// # Units
//
// Inside the engine, time is an int64 count of microseconds and tokens are
// int64 micro-tokens (TokenScale of them make one token); a bucket's state
// counts in scaled units of 1/(TokenScale*Params.RateDen) token, so that a
// refill is an exact product (see Params). Microseconds are the resolution
// of the clocks the shared stores offer (Redis TIME, PostgreSQL
// timestamps), so one resolution everywhere is what lets every store give
// the very same answer, and integers make boundaries exact: a request that
// arrives exactly when the bucket holds its cost is admitted. Micros,
// Duration, ToMicroTokens and FromMicroTokens convert at the edge; package
// sluice speaks time.Duration and float64 tokens, never these units.
//
// # The steps
//
// A limit's Params are its integer form (sluice.Limit.Params). Each step
// takes the key's state (absent when the key has none: a full bucket),
// the time, and a Charge, the integer form of a request that
// sluice.Request.Charged has already validated, and answers an Outcome:
//
//   - TakeTokenBucket / RefundTokenBucket over a BucketState (token and
//     leaky buckets);
//   - TakeFixedWindow / RefundFixedWindow over a WindowState, placed by
//     WindowOffset when the limit fixes no start;
//   - TakeSlidingLog / RefundSlidingLog over a []LogEntry;
//   - TakeSlidingWindow / RefundSlidingWindow over a SlidingState, and
//     TakeCalendarWindow / RefundCalendarWindow over a WindowState, on the
//     window Bounds that Windows computes (in the process, where the
//     time-zone database is, for a calendar window);
//   - StepLease over a []LeaseEntry, a concurrency limit's held slots;
//   - Evaluate and Refund dispatch to all but StepLease over a State, for a
//     store that keeps every algorithm's state in one shape (the memory
//     store).
//
// A store is handed each request charged (a sluice.Charged: the limit,
// the key and this Charge), by the sluice.Limiter, which validated it
// and computed its charge once: a store applies the charge as it stands
// and judges nothing again, so that every store refuses the same input
// with the same error, before any server is asked. Code that drives a
// store directly charges its requests with sluice.Request.Charged too
// (conformance.Take and conformance.TakeAll do).
//
// A take that is rejected changes nothing: the store must not write the
// state. MaxDebt bounds a reservation's debt so that every value stays
// below 2^52 (MaxExactScaled), the range a store computing in doubles
// (Redis's Lua) counts exactly. When a limit is reloaded under the same
// name, ConvertBucket carries a bucket over a change of rate, and
// ConvertWindow a fixed (or calendar) window over a change of capacity,
// keeping what the window used: a store records with each key's state the
// rate denominator of a bucket, or the capacity of a window, it was
// written under.
//
// # Atomicity
//
// A store applies one step to one key's state atomically: a mutex or a
// lock stripe in memory, one Lua script in Redis, one statement in
// PostgreSQL. Several keys asked together (sluice.Store.TakeAll) are
// all-or-nothing: if any is rejected, none is charged. The time is the
// store's own reading, taken once per call: Redis's TIME inside the script,
// PostgreSQL's clock, the process's clock in memory, or a test's fake
// clock.
//
// # Conformance
//
// Package conformance (github.com/sluicehq/sluice/conformance) is the
// runner a store passes: vectors written by an independent oracle, and
// invariants, leases, waits and settlement run against any sluice.Store.
// A new store calls conformance.Run and its siblings from its tests.
package engine
