package sluice_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// Attack: draining a bucket with Waits that are bound to give up. A
// caller whose deadline is too near for its turn calls Wait while another
// caller takes the one token there is, right after the store answered the
// waiter (the hook below puts the honest take there). Had Wait charged on
// its way to the error (reserve, then refund the late turn), the honest
// take would find the bucket in debt and be refused. Wait's refusal
// charges nothing, so it is admitted and the bucket ends exactly as the
// honest caller left it.
func TestAttackWaitDeadlineChargesNothing(t *testing.T) {
	e := newWaitEnv(t)
	l := sluice.MustLimit(sluice.Spec{Name: "drain", Rate: 10, Period: time.Hour, Capacity: 2})
	bg := context.Background()
	r := sluice.Request{Limit: l, Key: "k"}
	inner := e.lim.Store()
	var honest []sluice.Decision
	hooked := &hookStore{Store: inner, after: func() {
		dec, err := inner.Take(bg, sluice.OpTake, r)
		if err != nil {
			t.Fatal(err)
		}
		honest = append(honest, dec)
	}}
	attacker := sluice.NewWithOptions(hooked, sluice.Options{Clock: e.clk})
	for round := range 3 {
		if _, err := inner.Take(bg, sluice.OpTake, r); err != nil { // 1 token left
			t.Fatal(err)
		}
		err := attacker.Wait(e.within(d/2), sluice.Request{Limit: l, Key: "k", Cost: 2}) // a turn d away
		if !errors.Is(err, sluice.ErrBeyondDeadline) {
			t.Fatalf("round %d: attacking Wait: %v, want ErrBeyondDeadline", round, err)
		}
		if len(honest) != round+1 || !honest[round].Allowed {
			t.Fatalf("round %d: the honest take of the token left, made while the waiter was answered: %+v", round, honest)
		}
		e.empty(r, d)
		e.clk.Advance(2 * d) // full again
	}
	e.pending(0)
}

// hookStore calls after once the first Take of each call has been
// answered, before the caller sees the answer.
type hookStore struct {
	sluice.Store
	after func()
}

func (h *hookStore) Take(ctx context.Context, op sluice.Op, r sluice.Request) (sluice.Decision, error) {
	d, err := h.Store.Take(ctx, op, r)
	if op == sluice.OpTake {
		h.after()
	}
	return d, err
}

// Attack: waiters that give up in a storm. Every cancelled Wait gives its
// reservation back exactly once: none is kept (the bucket would stay in
// debt and refuse others for the waiters' turns) and none is given twice
// (the bucket would hold tokens nobody paid for).
func TestAttackCancelledWaitsGiveBackExactlyOnce(t *testing.T) {
	e := newWaitEnv(t)
	l := sluice.MustLimit(sluice.Spec{Name: "storm", Rate: 10, Period: time.Hour, Capacity: 3})
	r := sluice.Request{Limit: l, Key: "k"}
	if _, err := e.lim.Take(context.Background(), sluice.Request{Limit: l, Key: "k", Cost: 3}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var dones []chan error
	for range 16 {
		dones = append(dones, e.start(ctx, r))
	}
	e.asleep(16, dones...)
	e.clk.Advance(d / 2) // none of the turns (d .. 16d) has come
	e.pending(16)
	cancel()
	for _, c := range dones {
		if err := e.result(c); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: %v", err)
		}
	}
	// Half a token has refilled since the bucket was emptied, no more.
	e.empty(r, d/2)
}

// Attack: a key that forges log lines. A rejection's error quotes the key,
// so the control characters in it cannot start a line of their own
// wherever the error is logged.
func TestAttackLimitedErrorQuotesKey(t *testing.T) {
	e := newWaitEnv(t)
	l := sluice.MustLimit(sluice.Spec{Name: "quoted", Rate: 1, Period: time.Hour, Capacity: 1})
	key := "u1\nlevel=INFO msg=\"admin login ok\"\r\x1b[2J"
	r := sluice.Request{Limit: l, Key: key}
	e.lim.TakeOrError(context.Background(), r)
	_, err := e.lim.TakeOrError(context.Background(), r)
	var le *sluice.LimitedError
	if !errors.As(err, &le) || le.Key != key {
		t.Fatalf("%v, want a *LimitedError for the key as given", err)
	}
	if msg := err.Error(); strings.ContainsAny(msg, "\n\r\x1b") {
		t.Fatalf("the error carries the key's control characters: %q", msg)
	}
}
