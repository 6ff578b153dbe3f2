package redis_test

import (
	"context"
	"fmt"
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
