package redis_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/redis"
)

func TestLeases(t *testing.T) {
	conformance.RunLeases(t, vectorStore(standaloneURL(t), redis.Options{}), conformance.LeaseOptions{})
}

func TestClusterLeases(t *testing.T) {
	conformance.RunLeases(t, vectorStore(clusterURL(t), redis.Options{}), conformance.LeaseOptions{})
}

// On the server's clock (TIME, no test clock) a dead holder's slot comes
// back when its lease ends, and the key is gone with it. The test waits
// for a lease, not for tokens: the lease is short, and its end is
// observed, not timed.
func TestLeaseServerClock(t *testing.T) {
	prefix := fmt.Sprintf("lease%d:", testSeq.Add(1))
	s := open(t, standaloneURL(t), redis.Options{KeyPrefix: prefix})
	lim := sluice.New(s)
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: lease})
	start := time.Now()
	held, d, err := lim.Acquire(ctx, sluice.Request{Limit: cc, Key: "k"})
	if err != nil || !d.Allowed {
		t.Fatalf("acquire: %+v, %v", d, err)
	}
	_ = held // never released: its holder died
	_, d, err = lim.Acquire(ctx, sluice.Request{Limit: cc, Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < lease/2 && (d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > lease) {
		t.Fatalf("a second acquire while the first is held: %+v; want rejected with a retry within the lease", d)
	}
	key := prefix + cc.StorageKey("k")
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, d, err = lim.Acquire(ctx, sluice.Request{Limit: cc, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead holder's slot is still held 10s after a %v lease: %+v", lease, d)
		}
		time.Sleep(d.RetryAfter)
	}
	if since := time.Since(start); since < lease {
		t.Fatalf("the slot came back after %v, before the %v lease ended", since, lease)
	}
	ttl, err := s.Client().Do(ctx, s.Client().B().Pttl().Key(key).Build()).AsInt64()
	if err != nil || ttl <= 0 || ttl > lease.Milliseconds()+1 {
		t.Fatalf("the key's TTL is %dms (%v); want at most the %v lease", ttl, err, lease)
	}
}

// Attack: fill Redis with keys by renewing (or releasing) leases of keys
// that hold none, which the API token lets any trusted service ask with
// any key. Neither writes a key: only an admitted acquire does.
func TestAttackLeaseRenewOfNothingWritesNothing(t *testing.T) {
	prefix := fmt.Sprintf("renew%d:", testSeq.Add(1))
	s := open(t, standaloneURL(t), redis.Options{KeyPrefix: prefix})
	lim := sluice.New(s)
	ctx := context.Background()
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: time.Minute})
	conformance.CallsOnNothing(ctx, t, lim, cc, 50)
	c := s.Client()
	keys := func() []string {
		t.Helper()
		ks, err := c.Do(ctx, c.B().Keys().Pattern(prefix+"*").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		return ks
	}
	if ks := keys(); len(ks) != 0 {
		t.Fatalf("keys written by renewals and releases of nothing: %v", ks)
	}
	if _, d, err := lim.Acquire(ctx, sluice.Request{Limit: cc, Key: "held"}); err != nil || !d.Allowed || len(keys()) != 1 {
		t.Fatalf("an acquire: %+v, %v, keys %v; want its key", d, err, keys())
	}
}

// Attack: hold a concurrency slot past the request by hanging up. A
// handler's Release is deferred on the request's context, which is done
// once its client has gone; the release is cleanup, and still frees the
// slot, on a global key as on the client's own.
func TestAttackHungUpClientKeepsItsSlot(t *testing.T) {
	s := open(t, standaloneURL(t), redis.Options{KeyPrefix: fmt.Sprintf("hangup%d:", testSeq.Add(1))})
	lim := sluice.New(s)
	cc := sluice.MustLimit(sluice.Spec{Name: "cc", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: time.Hour})
	req := sluice.Request{Limit: cc, Key: "upstream"}
	ctx, hangUp := context.WithCancel(context.Background())
	lease, d, err := lim.Acquire(ctx, req)
	if err != nil || !d.Allowed {
		t.Fatalf("acquire: %+v, %v", d, err)
	}
	hangUp()
	if err := lease.Release(ctx); err != nil {
		t.Errorf("release after the client hung up: %v", err)
	}
	if _, d, err := lim.Acquire(context.Background(), req); err != nil || !d.Allowed {
		t.Fatalf("the next client's acquire: %+v, %v; want the slot the hung-up client's request released", d, err)
	}
}

// Attack: hold a concurrency slot with no request at all, by hanging up
// while the acquire is on its way. The store takes the slot and answers;
// an acquire that returned the caller's cancellation instead left a slot
// held under an id no one was given, until its lease ended: a client
// capped at its own slots (a per-client rule acquired first, released
// when the request ends) took one of a global rule's slots per hang-up.
// The acquire runs to its deadline, so the slot comes back to be
// released. Redis holds the acquire while writes are paused, so the
// hang-up lands after Redis has it and before it answers.
func TestAttackHangUpDuringAcquireHoldsSlot(t *testing.T) {
	srv := newStandalone(t)
	url := "redis://" + srv.Addr()
	lim := sluice.New(open(t, url, redis.Options{}))
	admin := open(t, url, redis.Options{}).Client()
	bg := context.Background()
	cmd := func(args ...string) string {
		t.Helper()
		v, err := admin.Do(bg, admin.B().Arbitrary(args...).Build()).ToAny()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return fmt.Sprint(v)
	}
	cc := sluice.MustLimit(sluice.Spec{Name: "global", Algorithm: sluice.Concurrency, MaxInFlight: 1, LeaseTerm: time.Hour})
	req := sluice.Request{Limit: cc, Key: "upstream"}
	// The script is loaded, as on a server in use (a first EVALSHA is
	// answered NOSCRIPT, and its EVAL sent only if the caller still waits).
	if lease, _, err := lim.Acquire(bg, req); err != nil || lease.Release(bg) != nil {
		t.Fatal(err)
	}
	// Calls at once, as a server in use makes them, put the connection in
	// the mode where a call returns as soon as its caller gives up.
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 20 {
				lim.Peek(bg, req)
			}
		})
	}
	wg.Wait()
	cmd("CLIENT", "PAUSE", "60000", "WRITE")
	ctx, hangUp := context.WithTimeout(bg, 30*time.Second)
	type acquired struct {
		lease sluice.Lease
		err   error
	}
	done := make(chan acquired, 1)
	go func() {
		lease, _, err := lim.Acquire(ctx, req)
		done <- acquired{lease, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(cmd("INFO", "clients"), "blocked_clients:1"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the acquire never reached Redis")
		}
	}
	hangUp()
	var got acquired
	select {
	case got = <-done: // the acquire gave up with its caller
	case <-time.After(100 * time.Millisecond): // it runs on, to its deadline
	}
	cmd("CLIENT", "UNPAUSE")
	if got == (acquired{}) {
		got = <-done
	}
	// What a caller does however its acquire went: release what it holds.
	if err := got.lease.Release(bg); err != nil {
		t.Fatal(err)
	}
	if _, d, err := lim.Acquire(bg, req); err != nil || !d.Allowed {
		t.Fatalf("the next client's acquire: %+v, %v; the hung-up caller's acquire (%v) left the only slot held", d, err, got.err)
	}
}
