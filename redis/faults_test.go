package redis_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redis"
)

// What a fault costs a limit, measured on a real server (docs/operations.md,
// "Faults", quotes these figures).

// Takes that missed their deadline against a hung Redis (SIGSTOP) were
// already written to its socket: when it resumes it runs them, and their
// charges stand though the caller was told the store failed. A timed-out
// take may cost its tokens; it never costs more.
func TestTimedOutTakesMayBeChargedOnResume(t *testing.T) {
	srv := newStandalone(t)
	const timeout = 100 * time.Millisecond
	// The breaker must not refuse the takes before they are sent.
	s := open(t, withQuery("redis://"+srv.Addr(), slowClientTimeouts), redis.Options{Timeout: timeout, BreakerFailures: 100, NoOverLimitCache: true})
	ctx := context.Background()
	const burst, cost, takes = 100, 5, 5
	lim := uniqueLimit(t, sluice.Spec{Name: "resume", Rate: 1, Period: time.Hour, Capacity: burst})
	req := sluice.Request{Limit: lim, Key: "k", Cost: cost}
	// The first call opens the connection: on a loaded machine it may
	// miss the short deadline, so it is retried until it answers.
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := conformance.Take(ctx, s, engine.OpPeek, req)
		if err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for the server, not for tokens
	}
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	for i := range takes {
		if _, err := conformance.Take(ctx, s, engine.OpTake, req); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("take %d against a hung Redis: %v, want its deadline", i+1, err)
		}
	}
	srv.Signal(syscall.SIGCONT)
	resumed = true
	var d sluice.Decision
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		if d, err = conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: lim, Key: "k"}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("Redis did not answer after SIGCONT: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for the server, not for tokens
	}
	// A peek reports what would remain after taking its cost, 1.
	charged := burst - (d.Remaining + 1)
	if charged < 0 || charged > takes*cost {
		t.Fatalf("%d tokens charged by %d timed-out takes of cost %d: want 0 to %d", charged, takes, cost, takes*cost)
	}
	t.Logf("%d timed-out takes of cost %d charged %d tokens once Redis resumed", takes, cost, charged)
}

// A Redis that restarts empty (no persistence: --save "" --appendonly no)
// forgets every bucket: each key starts again from a full one. Over a
// window that holds one such restart a key admits at most twice its
// burst plus what its rate refills.
func TestEmptyRestartGivesOneFreshBucket(t *testing.T) {
	srv := newStandalone(t)
	s := open(t, "redis://"+srv.Addr(), redis.Options{Timeout: 2 * time.Second, NoOverLimitCache: true})
	ctx := context.Background()
	const burst = 10
	lim := uniqueLimit(t, sluice.Spec{Name: "restart-empty", Rate: 1, Period: time.Hour, Capacity: burst})
	// admit takes until 3*burst takes were answered; a take that fails
	// (a connection the restart closed, found by its first use) charges
	// nothing the count misses: it either never ran or was answered.
	admit := func() int {
		n, answered := 0, 0
		for range 10 * burst {
			d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
			if err != nil {
				time.Sleep(20 * time.Millisecond) // waiting for the server, not for tokens
				continue
			}
			if d.Allowed {
				n++
			}
			if answered++; answered == 3*burst {
				return n
			}
		}
		t.Fatalf("%d of %d takes answered", answered, 10*burst)
		return n
	}
	before := admit()
	srv.Stop()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var after int
	for deadline := time.Now().Add(10 * time.Second); ; {
		// The first calls after the restart may find the old connection
		// closed (or the breaker open): retried until the store answers.
		if _, err := conformance.Take(ctx, s, engine.OpPeek, sluice.Request{Limit: lim, Key: "k"}); err == nil {
			after = admit()
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no answer after the restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for the server, not for tokens
	}
	// An hour's rate refills at most one token over the test.
	if before < burst || before > burst+1 || after < burst || after > burst+1 {
		t.Fatalf("admitted %d before the restart and %d after; want the burst (%d) each, one more at most", before, after, burst)
	}
	t.Logf("burst %d: admitted %d before an empty restart and %d after, %d in all", burst, before, after, before+after)
}

// replOffset reads a replication offset field of INFO replication.
func replOffset(t *testing.T, addr, field string) int64 {
	t.Helper()
	out, err := redistest.CLI(addr, "INFO", "replication")
	if err != nil {
		t.Fatalf("INFO replication on %s: %v", addr, err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s on %s: %q", field, addr, v)
			}
			return n
		}
	}
	t.Fatalf("no %s in INFO replication of %s:\n%s", field, addr, out)
	return 0
}

// A failover promotes a replica, which has what the primary had sent it:
// replication is asynchronous, so a charge the primary made and had not
// yet sent is lost with it, and its key admits that much again. With the
// replica caught up (its offset at the primary's), nothing is lost; with the replica behind by
// every take of a burst (cut off from the primary while they ran), the promoted replica
// gives the key a full bucket again: one fresh bucket, as after an empty
// restart.
func TestFailoverLosesOnlyUnreplicatedCharges(t *testing.T) {
	const burst = 10
	for _, lagging := range []bool{false, true} {
		primary := newStandalone(t)
		replica := redistest.New(t, "--replicaof", primary.Host, strconv.Itoa(primary.Port))
		for deadline := time.Now().Add(10 * time.Second); ; {
			out, _ := redistest.CLI(replica.Addr(), "INFO", "replication")
			if strings.Contains(out, "master_link_status:up") {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("the replica did not connect: %s", out)
			}
			time.Sleep(20 * time.Millisecond) // waiting for the server, not for tokens
		}
		lim := uniqueLimit(t, sluice.Spec{Name: "failover", Rate: 1, Period: time.Hour, Capacity: burst})
		req := sluice.Request{Limit: lim, Key: "k"}
		admit := func(s *redis.Store) int {
			n := 0
			for range 2 * burst {
				d, err := conformance.Take(context.Background(), s, engine.OpTake, req)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					n++
				}
			}
			return n
		}
		if lagging {
			// Cut off from the primary (a partition): the takes below
			// never reach it.
			if out, err := redistest.CLI(replica.Addr(), "REPLICAOF", "NO", "ONE"); err != nil || !strings.Contains(out, "OK") {
				t.Fatalf("detaching the replica: %q, %v", out, err)
			}
		}
		before := admit(open(t, "redis://"+primary.Addr(), redis.Options{Timeout: 2 * time.Second, NoOverLimitCache: true}))
		if !lagging {
			// WAIT would wait only for redis-cli's own writes (none): the
			// replica has caught up once its offset reaches the primary's.
			want := replOffset(t, primary.Addr(), "master_repl_offset")
			for deadline := time.Now().Add(10 * time.Second); replOffset(t, replica.Addr(), "slave_repl_offset") < want; {
				if time.Now().After(deadline) {
					t.Fatalf("the replica did not reach the primary's offset %d", want)
				}
				time.Sleep(20 * time.Millisecond) // waiting for the server, not for tokens
			}
		}
		primary.Stop()
		if out, err := redistest.CLI(replica.Addr(), "REPLICAOF", "NO", "ONE"); err != nil || !strings.Contains(out, "OK") {
			t.Fatalf("promoting the replica: %q, %v", out, err)
		}
		after := admit(open(t, "redis://"+replica.Addr(), redis.Options{Timeout: 2 * time.Second, NoOverLimitCache: true}))
		want := 0
		if lagging {
			want = burst
		}
		// An hour's rate refills at most one token over the test.
		if before < burst || before > burst+1 || after < want || after > want+1 {
			t.Fatalf("lagging %v: admitted %d on the primary and %d on the promoted replica; want %d and %d", lagging, before, after, burst, want)
		}
		t.Logf("replica lagging %v: burst %d, admitted %d on the primary, %d more on the promoted replica", lagging, burst, before, after)
	}
}
