package engine

import "math/bits"

// BucketState is the stored state of one token (or leaky) bucket key.
//
// Scaled is its tokens in scaled units of 1/(TokenScale*RateDen) token
// (see Params), not the micro-tokens of an Outcome; Stamp is the
// microsecond up to which refill has been counted. A key with no state is
// a full bucket: the zero value is not, so stores keep "absent" apart
// from any BucketState.
type BucketState struct {
	Scaled int64
	Stamp  int64
}

// TakeTokenBucket decides one request against a token bucket at time now
// (microseconds) and returns the state to store if the request is admitted.
//
// The bucket refills lazily and continuously: elapsed = max(0, now-Stamp),
// tokens = min(capacity, tokens + elapsed*rate). A clock that steps back
// adds nothing and keeps Stamp where it was, so the same interval is never
// counted twice. The request is admitted when tokens >= cost, leaving
// tokens-cost.
//
// With reserve set, a request that finds too few tokens is admitted anyway
// when the debt it leaves, cost-tokens, is at most maxReserved: the tokens go
// negative and RetryAfter says when the reserved turn comes (when the
// bucket is back at zero). Otherwise the request is rejected, RetryAfter is
// the wait until it would be admitted, and the state must not be written:
// a rejection changes nothing.
//
// Because tokens are scaled by RateDen, the refill is the exact integer
// elapsed*RateNum: nothing is rounded away between calls, however often a
// key is polled. Waits round up to the next microsecond, so a caller that
// waits exactly RetryAfter finds the bucket holding its cost: boundaries
// are exact.
//
// A reservation may cost more than the capacity: a bucket of 10 at 10 a
// minute that holds 6 and is asked for 16 goes 10 into debt, and the turn
// comes a minute later. With a capacity of zero every request waits, its
// turn cost/rate after the previous one's.
//
// cost and maxReserved are in micro-tokens and have been validated
// (0 < cost <= capacity, plus maxReserved when reserving).
func TakeTokenBucket(p *Params, st BucketState, present bool, now, cost int64, reserve bool, maxReserved int64) (BucketState, Outcome) {
	tokens, stamp := refillBucket(p, st, present, now)
	lag := stamp - now // > 0 only when the clock stepped back
	need := cost * p.RateDen
	var allowed bool
	var retry int64
	switch {
	case tokens >= need:
		allowed = true
		tokens -= need
	case reserve && need-tokens <= maxReserved*p.RateDen:
		allowed = true
		tokens -= need
		retry = lag + ceilDivBy(-tokens, p.RateNum, p.rateInv)
	default:
		if reserve {
			// Admitted once the debt it would leave fits within maxReserved.
			need -= maxReserved * p.RateDen
		}
		retry = lag + ceilDivBy(need-tokens, p.RateNum, p.rateInv)
	}
	// bucketOutcome, written out: the Outcome is built from values in
	// registers, with no call but a division by a rate denominator.
	micro, reset := tokens, int64(0)
	if p.RateDen != 1 {
		micro = floorDivBy(tokens, p.RateDen, p.denInv)
	}
	if full := p.Capacity * p.RateDen; tokens < full {
		reset = lag + ceilDivBy(full-tokens, p.RateNum, p.rateInv)
	}
	return BucketState{Scaled: tokens, Stamp: stamp}, Outcome{Allowed: allowed, Tokens: micro, RetryAfter: retry, ResetAfter: reset}
}

// refillBucket returns a bucket's scaled tokens and stamp as of now: the
// lazy, continuous refill shared by takes and refunds.
func refillBucket(p *Params, st BucketState, present bool, now int64) (tokens, stamp int64) {
	full := p.Capacity * p.RateDen
	if !present {
		return full, now
	}
	tokens, stamp = st.Scaled, st.Stamp
	if now > stamp {
		if tokens < full {
			hi, lo := bits.Mul64(uint64(now-stamp), uint64(p.RateNum))
			if hi != 0 || lo >= uint64(full-tokens) {
				tokens = full
			} else {
				tokens += int64(lo)
			}
		}
		stamp = now
	}
	if tokens > full { // the capacity was lowered since the state was written
		tokens = full
	}
	return tokens, stamp
}

// bucketOutcome returns an Outcome's tokens (micro-tokens) and reset wait
// from scaled tokens.
func bucketOutcome(p *Params, tokens, lag int64) (micro, reset int64) {
	micro = tokens
	if p.RateDen != 1 { // whole micro-tokens per µs need no division
		micro = floorDivBy(tokens, p.RateDen, p.denInv)
	}
	if full := p.Capacity * p.RateDen; tokens < full {
		reset = lag + ceilDivBy(full-tokens, p.RateNum, p.rateInv)
	}
	return micro, reset
}

// RefundTokenBucket gives amount micro-tokens back to a token (or leaky)
// bucket at time now, never above its capacity: for a request that was
// charged but not carried out (Envoy's negative hits). The bucket is
// refilled to now first, exactly as a take would. A refund also pays back
// reservation debt. An absent key is a full bucket: nothing to give back,
// and write is false. The Outcome is allowed, with the tokens after.
func RefundTokenBucket(p *Params, st BucketState, present bool, now, amount int64) (next BucketState, o Outcome, write bool) {
	tokens, stamp := refillBucket(p, st, present, now)
	full := p.Capacity * p.RateDen
	if present {
		if amount >= (full-tokens)/p.RateDen+1 { // also guards the product below
			tokens = full
		} else {
			tokens = min(full, tokens+amount*p.RateDen)
		}
	}
	o.Allowed = true
	o.Tokens, o.ResetAfter = bucketOutcome(p, tokens, stamp-now)
	return BucketState{Scaled: tokens, Stamp: stamp}, o, present
}

// ConvertBucket carries a token (or leaky) bucket's scaled tokens, written
// under a limit of rate denominator fromDen, over to the limit of
// parameters p: what a store does when a limit keeps its name but changes
// its rate, period or capacity (a reload), so that no key's bucket is
// reset by it. The tokens are carried as an absolute amount, not as a
// share of the old capacity: floored to a whole micro-token (never in the
// key's favour), capped at p's capacity (a key at 25 of 30 holds 20 of a
// new 20; a raised capacity refills nothing), and a debt is kept up to
// MaxDebt(p), the most any store counts exactly under p. A drained key
// stays drained. The refill stamp is unchanged: the new rate applies from
// it on. With fromDen equal to p's, tokens are returned as they are but
// for the cap; fromDen <= 0 (state of no known rate) is a full bucket.
func ConvertBucket(p *Params, tokens, fromDen int64) int64 {
	full := p.Capacity * p.RateDen
	if fromDen <= 0 {
		return full
	}
	if fromDen == p.RateDen {
		return min(tokens, full)
	}
	micro := min(FloorDiv(tokens, fromDen), p.Capacity)
	micro = max(micro, -MaxDebt(p))
	return micro * p.RateDen
}
