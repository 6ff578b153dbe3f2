package engine

import (
	"crypto/sha1"
	"encoding/binary"
)

// WindowState is the stored state of one fixed-window key: the micro-tokens
// left and the start of the window they were counted in (microseconds).
type WindowState struct {
	Tokens int64
	Start  int64
}

// WindowOffset is where a key's windows start within the period when the
// limit fixes no start: the first 48 bits of the SHA-1 of the key, modulo
// the period. Spreading starts this way keeps every key from refilling at
// the same instant (no thundering herd at :00). SHA-1 is chosen because
// every engine has it (Redis scripts' redis.sha1hex, PostgreSQL's sha1()),
// and 48 bits because a Lua number holds them exactly.
func WindowOffset(key string, period int64) int64 {
	sum := sha1.Sum([]byte(key))
	var b [8]byte
	copy(b[2:], sum[:6])
	return int64(binary.BigEndian.Uint64(b[:]) % uint64(period))
}

// TakeFixedWindow decides one request against a fixed window with
// rollover at time now (microseconds) and returns the state to store if the
// request is admitted.
//
// Windows of Period microseconds start at offset (mod Period). At each
// boundary WindowRate micro-tokens arrive; what is unused rolls over, up to
// Capacity. Tokens arrive only at boundaries, so no window ever admits more
// than Capacity, unlike a token bucket, which admits up to capacity + rate
// within one period. An absent key starts full in the window containing
// now. A clock that steps back stays in the window already counted.
//
// With reserve set, a request that finds too few tokens is admitted anyway
// when the debt it leaves, cost-tokens, is at most maxReserved: the tokens
// go negative, later windows pay the debt before they add anything, and
// RetryAfter is the wait until the boundary at which the debt is paid
// (the reserved turn). A debt of 6 at a rate of 10 is paid at the next
// boundary; a debt of 11 at the one after.
//
// A rejected request gets RetryAfter = the wait until the boundary at which
// enough tokens will have arrived (for a reservation, enough that its debt
// fits within maxReserved); the state must not be written.
//
// cost and maxReserved are in micro-tokens and have been validated
// (0 < cost <= capacity, plus maxReserved when reserving).
func TakeFixedWindow(p *Params, st WindowState, present bool, now, cost, offset int64, reserve bool, maxReserved int64) (WindowState, Outcome) {
	tokens, start := rollWindow(p, st, present, now, offset)
	var o Outcome
	switch {
	case tokens >= cost:
		o.Allowed = true
		tokens -= cost
	case reserve && cost-tokens <= maxReserved:
		o.Allowed = true
		tokens -= cost
		o.RetryAfter = start + ceilDiv(-tokens, p.WindowRate)*p.Period - now
	default:
		need := cost
		if reserve {
			// Admitted once the debt it would leave fits within maxReserved.
			need -= maxReserved
		}
		o.RetryAfter = start + ceilDiv(need-tokens, p.WindowRate)*p.Period - now
	}
	windowOutcome(p, tokens, start, now, &o)
	return WindowState{Tokens: tokens, Start: start}, o
}

// rollWindow returns a key's tokens and window start as of now: the
// boundaries crossed since the state was written, each adding WindowRate
// up to Capacity (paying a reservation's debt first: tokens may be
// negative). An absent key is full in the window containing now.
func rollWindow(p *Params, st WindowState, present bool, now, offset int64) (tokens, start int64) {
	if !present {
		into := (now - offset) % p.Period
		if into < 0 {
			into += p.Period
		}
		return p.Capacity, now - into
	}
	tokens, start = st.Tokens, st.Start
	if now-start >= p.Period {
		k := (now - start) / p.Period
		start += k * p.Period
		if room := p.Capacity - tokens; k > room/p.WindowRate {
			tokens = p.Capacity
		} else {
			tokens += k * p.WindowRate
		}
	}
	return min(tokens, p.Capacity), start
}

func windowOutcome(p *Params, tokens, start, now int64, o *Outcome) {
	o.Tokens = tokens
	if tokens < p.Capacity {
		o.ResetAfter = start + ceilDiv(p.Capacity-tokens, p.WindowRate)*p.Period - now
	}
}

// RefundFixedWindow gives amount micro-tokens back to a fixed window at
// time now, never above its capacity, after rolling it forward as a take
// would; a refund also pays back reservation debt. An absent key is full:
// nothing to give back, write is false.
func RefundFixedWindow(p *Params, st WindowState, present bool, now, amount, offset int64) (next WindowState, o Outcome, write bool) {
	tokens, start := rollWindow(p, st, present, now, offset)
	if present {
		if amount >= p.Capacity-tokens { // also guards the sum below
			tokens = p.Capacity
		} else {
			tokens += amount
		}
	}
	o.Allowed = true
	windowOutcome(p, tokens, start, now, &o)
	return WindowState{Tokens: tokens, Start: start}, o, present
}

// ConvertWindow carries a fixed window's tokens (a calendar window's
// too: they share WindowState), written under a limit of capacity
// fromCap, over to the limit of parameters p: what a store does when a
// limit keeps its name but changes its capacity (a reload, a new xDS
// snapshot), so that no key's window is reset by it.
//
// A window keeps the count of what it used, fromCap - tokens, as Envoy's
// reference rate limit service counts hits per window and compares them
// with the limit of the moment: what is left under p is p's capacity less
// that count, never below zero and never above p's capacity. Raising 3 a
// minute to 5 after 3 were used leaves 2; lowering 5 to 2 after 3 leaves
// none (a lowered limit admits nothing more in that window, and pushes no
// key into debt); lowering 5 to 4 after 3 leaves 1, so the window admits
// 4 in all. A reservation's debt (tokens below zero) is kept as it is, up
// to MaxDebt(p), the most any store counts exactly under p. The window's
// start is unchanged and later boundaries add p's rate: the next window
// starts from the new limit as usual.
//
// fromCap <= 0 is state of no known capacity (written before stores
// recorded it, or under a capacity of zero, where every admission is a
// reservation and nothing is counted within the capacity): its tokens are
// kept as they are, capped at p's capacity. With fromCap equal to p's,
// tokens are returned as they are: nothing changed.
func ConvertWindow(p *Params, tokens, fromCap int64) int64 {
	switch {
	case fromCap == p.Capacity:
		return tokens
	case tokens < 0:
		return max(tokens, -MaxDebt(p))
	case fromCap <= 0:
		return min(tokens, p.Capacity)
	}
	return max(0, min(tokens, fromCap)-fromCap+p.Capacity)
}
