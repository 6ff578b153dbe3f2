package redis

import (
	_ "embed"
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// One Lua file per algorithm, each a line-for-line port of the root
// package's Go function, joined with the driver into one script: TakeAll
// mixes algorithms in one atomic call, and the batch writer mixes keys of
// every limit, so every algorithm has to be in the script that runs.
var (
	//go:embed lua/head.lua
	luaHead string
	//go:embed lua/tokenbucket.lua
	luaTokenBucket string
	//go:embed lua/fixedwindow.lua
	luaFixedWindow string
	//go:embed lua/slidinglog.lua
	luaSlidingLog string
	//go:embed lua/windows.lua
	luaWindows string
	//go:embed lua/main.lua
	luaMain string
)

// scriptSource is the whole script, as sent to Redis.
var scriptSource = luaHead + luaTokenBucket + luaFixedWindow + luaSlidingLog + luaWindows + luaMain

// replyWidth is the number of integers the script returns per request.
const replyWidth = 5

// maxLuaScaled bounds every value the script computes with. Lua numbers
// are doubles, exact for integers below 2^53; the root package allows
// scaled token-bucket values up to 2^62. Limits whose scaled capacity
// (capacity plus max_reserved, times the rate's denominator) reaches 2^52
// are refused, which leaves every intermediate (a sum, a quotient times its
// divisor) below 2^53. In practice this refuses only buckets of billions
// of tokens, or of millions with a rate that has no short fraction.
const maxLuaScaled = 1 << 52

// Group operations in the script's arguments.
const (
	opTake   = "t"
	opPeek   = "p"
	opRefund = "r"
)

// Supports refuses the limits that the store's script cannot compute
// exactly (see maxLuaScaled): a server checks every limit of its policy
// with it at start and on reload, so that no request finds out. The error
// is an input error (sluice.ErrInvalidLimit). It needs no connection.
func Supports(l *sluice.Limit) error { return fits(l, l.Params().MaxReserved) }

// Supports implements sluice.Store (see the function Supports).
func (s *Store) Supports(l *sluice.Limit) error { return Supports(l) }

// fits refuses a limit whose values, with a debt of up to res
// micro-tokens, the script cannot compute exactly. Supports checks the
// limit's own debt bound at start; a request that sets a larger
// max_reserved of its own is checked as it comes.
func fits(l *sluice.Limit, res int64) error {
	p := l.Params()
	if p.Algorithm == engine.Concurrency {
		return nil
	}
	den := p.RateDen
	if den <= 0 {
		den = 1
	}
	if hi := (float64(p.Capacity) + float64(res)) * float64(den); hi >= maxLuaScaled {
		return fmt.Errorf("redis store: limit %q: %w: capacity plus max_reserved times the rate denominator %d is %.3g scaled units, beyond the 2^52 the store's Lua computes exactly; write the rate as whole tokens per period or lower the capacity",
			l.Name(), sluice.ErrInvalidLimit, den, hi)
	}
	if p.Algorithm == engine.FixedWindow {
		// A reset time is up to ceil((capacity+max_reserved)/rate)+1
		// periods ahead.
		windows := (p.Capacity+res+p.WindowRate-1)/p.WindowRate + 1
		if hi := float64(windows) * float64(p.Period); hi >= maxLuaScaled {
			return fmt.Errorf("redis store: limit %q: %w: refilling the capacity takes %d periods of %dus, beyond the 2^52us the store's Lua computes exactly",
				l.Name(), sluice.ErrInvalidLimit, windows, p.Period)
		}
	}
	return nil
}

// appendGroup writes a group header: op, n requests and the time (""
// for the server's clock).
func appendGroup(args []string, n int, op, now string) []string {
	if i := strings.Index(opTake+opPeek+opRefund, op); now == "" && n < len(groupHeads[0]) && i >= 0 {
		return append(args, groupHeads[i][n])
	}
	h := op + strconv.Itoa(n)
	if now != "" {
		h += ":" + now
	}
	return append(args, h)
}

// groupHeads are the headers of groups of a few requests on the server's
// clock, by op (take, peek, refund) and size: the usual headers, made
// once rather than per call.
var groupHeads = func() (h [3][17]string) {
	for i, op := range []string{opTake, opPeek, opRefund} {
		for n := range h[i] {
			h[i][n] = op + strconv.Itoa(n)
		}
	}
	return h
}()

// appendRequest writes one request's arguments (see lua/main.lua): the
// limit, the cost (with the debt it may leave when it reserves), and extra
// (a Cluster rollback's, or "" unless a fixed window hashes its offset
// from the key, or a calendar window needs its bounds, computed for now,
// this process's time in microseconds).
func appendRequest(args []string, r *sluice.Charged, extra string, now int64) []string {
	p, ch := r.Limit.Params(), r.Charge
	if p.Windowed() {
		return appendWindow(args, r, now)
	}
	var buf [128]byte
	b := buf[:0]
	switch p.Algorithm {
	case engine.FixedWindow:
		b = appendInts(b, "fw", p.Capacity, p.WindowRate, p.Period, p.Offset)
		if p.Offset < 0 && extra == "" {
			extra = r.Key
		}
	case engine.SlidingLog:
		b = appendInts(b, "sl", p.Capacity, p.Period)
	default:
		b = appendInts(b, "tb", p.Capacity, p.RateNum, p.RateDen)
	}
	n := len(b)
	b = strconv.AppendInt(b, ch.Cost, 10)
	if ch.Reserve && p.Algorithm != engine.SlidingLog {
		b = strconv.AppendInt(append(b, 'r'), ch.MaxReserved, 10)
	}
	// The limit and the cost cut from one string: one allocation for both.
	lc := string(b)
	return append(args, lc[:n], lc[n:], extra)
}

// needsNow reports whether appendRequest reads its now for l: only a
// calendar window's bounds do, so that other requests skip the clock.
func needsNow(l *sluice.Limit) bool {
	p := l.Params()
	return p.Windowed() && p.Calendar != 0
}

// outcome reads one request's reply.
func outcome(v []int64) engine.Outcome {
	return engine.Outcome{Allowed: v[0] == 1, Tokens: v[1], RetryAfter: v[2], ResetAfter: v[3]}
}

// ScriptSource returns the Lua script the store runs, for tools and
// benchmarks that drive it directly (the argument layout is documented at
// the top of lua/main.lua).
func ScriptSource() string { return scriptSource }

// appendWindow writes the arguments of a sliding or calendar window's
// request: "sw capacity period" or "cw capacity 0", the cost, and for a
// calendar the five bounds of engine.Windows around now, which the script
// picks from by its own clock (engine.Bounds.Pick).
func appendWindow(args []string, r *sluice.Charged, now int64) []string {
	ch := r.Charge
	p := r.Limit.Params()
	tag, period := "cw", p.Period
	if p.Algorithm == engine.SlidingWindow {
		tag = "sw"
	}
	var extra []byte
	if p.Calendar != 0 {
		period = 0
		for i, v := range engine.Windows(p, now) {
			if i > 0 {
				extra = append(extra, ' ')
			}
			extra = strconv.AppendInt(extra, v, 10)
		}
	}
	b := appendInts(nil, tag, p.Capacity, period)
	return append(args, string(b), strconv.FormatInt(ch.Cost, 10), string(extra))
}

// appendInts appends tag and each of vs after a space.
func appendInts(b []byte, tag string, vs ...int64) []byte {
	b = append(b, tag...)
	for _, v := range vs {
		b = strconv.AppendInt(append(b, ' '), v, 10)
	}
	return b
}
