package sluice_test

import (
	"context"
	"errors"
	"hash/fnv"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
)

// Wait, RetryAt and jitter on a store are conformance.RunWait's, run on
// every store; here on the pure arithmetic.
func TestWaitPureArithmetic(t *testing.T) { conformance.RunWait(t, newMapStore) }

const d = 6 * time.Minute // one token of 10 per hour

// clockedLimiter is a Limiter on the pure arithmetic and a manual clock,
// which starts on an hour boundary at least an hour after the real now.
func clockedLimiter(t *testing.T) (*sluice.Limiter, *sluice.ManualClock) {
	clk := sluice.NewManualClock(time.Now().Truncate(time.Hour).Add(2 * time.Hour))
	return sluice.NewWithOptions(newMapStore(t, clk), sluice.Options{Clock: clk}), clk
}

func TestTakeOrError(t *testing.T) {
	lim, clk := clockedLimiter(t)
	l := sluice.MustLimit(sluice.Spec{Name: "or-error", Rate: 10, Period: time.Hour, Capacity: 1, MaxReserved: 1})
	r := sluice.Request{Limit: l, Key: "user-42"}
	if dec, err := lim.TakeOrError(context.Background(), r); err != nil || !dec.Allowed {
		t.Fatalf("first: %+v, %v", dec, err)
	}
	dec, err := lim.TakeOrError(context.Background(), r)
	var le *sluice.LimitedError
	if !errors.Is(err, sluice.ErrLimited) || !errors.As(err, &le) || errors.Is(err, sluice.ErrBeyondDeadline) {
		t.Fatalf("second: %v, want a *LimitedError", err)
	}
	want := sluice.LimitedError{Rule: "or-error", Key: "user-42", RetryAfter: d, RetryAt: clk.Now().Add(d)}
	if le.Rule != want.Rule || le.Key != want.Key || le.RetryAfter != want.RetryAfter || !le.RetryAt.Equal(want.RetryAt) || dec.Allowed || dec.RetryAfter != d {
		t.Fatalf("second: %+v with %+v, want %+v", le, dec, want)
	}
	if msg := err.Error(); msg != `sluice: rate limited by "or-error" for key "user-42"; retry after 6m0s (at `+want.RetryAt.UTC().Format(sluice.RetryAtLayout)+`)` {
		t.Fatalf("message %q", msg)
	}
	// An admitted reservation is no error: its decision says when.
	r.Reserve = true
	if dec, err := lim.TakeOrError(context.Background(), r); err != nil || !dec.Allowed || dec.RetryAfter != d {
		t.Fatalf("reservation: %+v, %v", dec, err)
	}
	// A cost that can never succeed is the store's error, not a rejection.
	if _, err := lim.TakeOrError(context.Background(), sluice.Request{Limit: l, Key: "k", Cost: 5}); !errors.Is(err, sluice.ErrCostExceedsLimit) || errors.Is(err, sluice.ErrLimited) {
		t.Fatalf("impossible cost: %v", err)
	}
}

// Attack: draining a bucket with Waits that are bound to give up. A
// caller whose deadline is too near for its turn calls Wait while another
// caller takes the one token there is, right after the store answered the
// waiter (the hook below puts the honest take there). Had Wait charged on
// its way to the error (reserve, then refund the late turn), the honest
// take would find the bucket in debt and be refused. Wait's refusal
// charges nothing, so it is admitted and the bucket ends exactly as the
// honest caller left it.
func TestAttackWaitDeadlineChargesNothing(t *testing.T) {
	e := conformance.NewWaitEnv(t, newMapStore)
	l := sluice.MustLimit(sluice.Spec{Name: "drain", Rate: 10, Period: time.Hour, Capacity: 2})
	bg := context.Background()
	r := sluice.Request{Limit: l, Key: "k"}
	inner := e.Limiter.Store()
	var honest []sluice.Decision
	hooked := &hookStore{Store: inner, after: func() {
		dec, err := conformance.Take(bg, inner, engine.OpTake, r)
		if err != nil {
			t.Fatal(err)
		}
		honest = append(honest, dec)
	}}
	attacker := sluice.NewWithOptions(hooked, sluice.Options{Clock: e.Clock})
	for round := range 3 {
		if _, err := conformance.Take(bg, inner, engine.OpTake, r); err != nil { // 1 token left
			t.Fatal(err)
		}
		err := attacker.Wait(e.Within(d/2), sluice.Request{Limit: l, Key: "k", Cost: 2}) // a turn d away
		if !errors.Is(err, sluice.ErrBeyondDeadline) {
			t.Fatalf("round %d: attacking Wait: %v, want ErrBeyondDeadline", round, err)
		}
		if len(honest) != round+1 || !honest[round].Allowed {
			t.Fatalf("round %d: the honest take of the token left, made while the waiter was answered: %+v", round, honest)
		}
		e.Empty(r, d)
		e.Clock.Advance(2 * d) // full again
	}
	e.Pending(0)
}

// hookStore calls after once the first Take of each call has been
// answered, before the caller sees the answer.
type hookStore struct {
	sluice.Store
	after func()
}

func (h *hookStore) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	d, err := h.Store.Take(ctx, op, r)
	if op == engine.OpTake {
		h.after()
	}
	return d, err
}

// Attack: waiters that give up in a storm. Every cancelled Wait gives its
// reservation back exactly once: none is kept (the bucket would stay in
// debt and refuse others for the waiters' turns) and none is given twice
// (the bucket would hold tokens nobody paid for).
func TestAttackCancelledWaitsGiveBackExactlyOnce(t *testing.T) {
	e := conformance.NewWaitEnv(t, newMapStore)
	l := sluice.MustLimit(sluice.Spec{Name: "storm", Rate: 10, Period: time.Hour, Capacity: 3})
	r := sluice.Request{Limit: l, Key: "k"}
	if _, err := e.Limiter.Take(context.Background(), sluice.Request{Limit: l, Key: "k", Cost: 3}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var dones []chan error
	for range 16 {
		dones = append(dones, e.Start(ctx, r))
	}
	e.Asleep(16, dones...)
	e.Clock.Advance(d / 2) // none of the turns (d .. 16d) has come
	e.Pending(16)
	cancel()
	for _, c := range dones {
		if err := e.Result(c); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: %v", err)
		}
	}
	// Half a token has refilled since the bucket was emptied, no more.
	e.Empty(r, d/2)
}

// Attack: a key that forges log lines. A rejection's error quotes the key,
// so the control characters in it cannot start a line of their own
// wherever the error is logged.
func TestAttackLimitedErrorQuotesKey(t *testing.T) {
	e := conformance.NewWaitEnv(t, newMapStore)
	l := sluice.MustLimit(sluice.Spec{Name: "quoted", Rate: 1, Period: time.Hour, Capacity: 1})
	key := "u1\nlevel=INFO msg=\"admin login ok\"\r\x1b[2J"
	r := sluice.Request{Limit: l, Key: key}
	e.Limiter.TakeOrError(context.Background(), r)
	_, err := e.Limiter.TakeOrError(context.Background(), r)
	var le *sluice.LimitedError
	if !errors.As(err, &le) || le.Key != key {
		t.Fatalf("%v, want a *LimitedError for the key as given", err)
	}
	if msg := err.Error(); strings.ContainsAny(msg, "\n\r\x1b") {
		t.Fatalf("the error carries the key's control characters: %q", msg)
	}
}

// Limit.Jitter spreads callers sharing one key by who they are, and a
// negative jitter is no limit. What it does to decisions is RunWait's.
func TestJitter(t *testing.T) {
	l := sluice.MustLimit(sluice.Spec{Name: "jittery", Rate: 1, Period: time.Minute, Capacity: 1, MaxReserved: 1, Jitter: 30 * time.Second})
	bg := context.Background()
	seen := map[time.Duration]bool{}
	for _, ip := range []string{"192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5"} {
		seen[l.Jitter(sluice.WithCaller(bg, sluice.Caller{IP: netip.MustParseAddr(ip)}), "global")] = true
	}
	if len(seen) < 3 {
		t.Fatalf("5 callers of one key got %d offsets", len(seen))
	}
	if _, err := sluice.NewLimit(sluice.Spec{Name: "neg", TokensPerSecond: 1, Jitter: -time.Second}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Fatalf("negative jitter: %v", err)
	}
}

// Spread is 64-bit FNV-1a over the parts with a zero byte between them:
// what the Retry-After jitter has always hashed.
func TestSpreadIsFNV(t *testing.T) {
	for _, c := range [][2]string{{"", ""}, {"ip:192.0.2.1", "/v1/auth"}, {"sub:alice", "/api/x"}} {
		h := fnv.New64a()
		h.Write([]byte(c[0]))
		h.Write([]byte{0})
		h.Write([]byte(c[1]))
		for _, n := range []uint64{0, 1, 7, 1 << 40} {
			if got, want := engine.Spread(n, c[0], c[1]), h.Sum64()%(n+1); got != want {
				t.Fatalf("Spread(%d, %q, %q) = %d, want %d", n, c[0], c[1], got, want)
			}
		}
	}
}

func TestManualClockTimers(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1000, 0))
	c, _ := clk.NewTimer(0)
	if got := <-c; !got.Equal(time.Unix(1000, 0)) {
		t.Fatalf("a timer of 0 fired at %v", got)
	}
	c1, stop1 := clk.NewTimer(time.Second)
	c2, _ := clk.NewTimer(2 * time.Second)
	if n, _ := clk.PendingTimers(); n != 2 {
		t.Fatalf("%d timers pending", n)
	}
	clk.Set(time.Unix(999, 0)) // backwards: nothing is due
	clk.Advance(1999 * time.Millisecond)
	select {
	case <-c1:
		t.Fatal("fired early")
	default:
	}
	clk.Advance(time.Millisecond)
	if got := <-c1; !got.Equal(time.Unix(1001, 0)) {
		t.Fatalf("fired at %v", got)
	}
	if stop1() {
		t.Fatal("stopped a timer that had fired")
	}
	n, changed := clk.PendingTimers()
	c3, stop3 := clk.NewTimer(time.Hour)
	<-changed
	if !stop3() || n != 1 {
		t.Fatalf("stop of a pending timer failed (%d pending before)", n)
	}
	clk.Advance(time.Hour)
	<-c2
	select {
	case <-c3:
		t.Fatal("a stopped timer fired")
	default:
	}
}
