package envoyrls_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/redis"
)

// refChangeYAML is a reference-format file whose per-user limit is
// requests_per_unit RPU a minute.
const refChangeYAML = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: RPU}\n"

// changedReferenceLimit reloads a reference-format file, as sluice serve
// does (policy.File with envoyrls.Parser), whose limit keeps its name but
// changes its requests_per_unit: the window keeps its count, as the
// reference counts hits per window and compares them with the limit of
// the moment. Raising 3 to 5 a minute after 3 were used admits exactly 2
// more in that window; lowering 5 to 2 after 3 were used admits none; the
// next window counts under the new limit.
func changedReferenceLimit(t *testing.T, store sluice.Store, clock *sluice.ManualClock) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	parse := envoyrls.Parser(func(string) string { return "" })
	file := &policy.File{Path: path, Parse: func(name string, data []byte) (*policy.Policy, error) {
		p, _, err := parse(name, data)
		return p, err
	}}
	var current atomic.Pointer[policy.Policy]
	reload := func(rpu int) {
		t.Helper()
		if err := os.WriteFile(path, []byte(strings.Replace(refChangeYAML, "RPU", fmt.Sprint(rpu), 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := file.Load(context.Background(), true)
		if err != nil || p == nil {
			t.Fatalf("reload to %d a minute: %v %v", rpu, p, err)
		}
		current.Store(p)
	}
	reload(3)
	s := envoyrls.New(current.Load(), sluice.NewWithOptions(store, sluice.Options{Clock: clock}), envoyrls.Options{StoreTimeout: time.Minute, Source: current.Load})
	admits := func(user string, n int) int {
		t.Helper()
		ok := 0
		for range n {
			resp, err := s.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", user)}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlspb.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	if n := admits("alice", 4); n != 3 {
		t.Fatalf("alice admitted %d of 4 under 3/min", n)
	}
	reload(5)
	if n := admits("alice", 4); n != 2 {
		t.Fatalf("alice admitted %d of 4 after 3/min, used up, became 5/min: want 2 (5 in the window in all)", n)
	}
	if n := admits("bob", 3); n != 3 {
		t.Fatalf("bob admitted %d of 3 under 5/min", n)
	}
	reload(2)
	if n := admits("bob", 3); n != 0 {
		t.Fatalf("bob admitted %d after 5/min became 2/min with 3 used: want none", n)
	}
	clock.Advance(time.Minute)
	if n := admits("bob", 3); n != 2 {
		t.Fatalf("bob admitted %d of 3 in the next window under 2/min", n)
	}
}

func TestReferenceChangedLimitKeepsWindowCountMemory(t *testing.T) {
	clock := sluice.NewManualClock(t0)
	changedReferenceLimit(t, memory.New(memory.Options{Clock: clock}), clock)
}

func TestReferenceChangedLimitKeepsWindowCountRedis(t *testing.T) {
	addr := redistest.Server(t)
	clock := sluice.NewManualClock(t0)
	store, err := redis.Open(fmt.Sprintf("redis://%s/0?timeout=1m&dial_timeout=1m&write_timeout=1m&key_prefix=refchange%d:", addr, time.Now().UnixNano()), redis.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	changedReferenceLimit(t, store, clock)
}

// TestAttackLoweredReferenceLimitStopsWindow: an operator lowers a limit
// to stop a client that is using it up. Before windows kept their count,
// the client kept what was left of the old limit (capped at the new one):
// 5 a minute with 3 used, lowered to 2, still admitted 2 more, 5 in a
// window of a limit of 2. Now the lowered limit admits none in that
// window.
func TestAttackLoweredReferenceLimitStopsWindow(t *testing.T) {
	clock := sluice.NewManualClock(t0)
	store := memory.New(memory.Options{Clock: clock})
	var current atomic.Pointer[policy.Policy]
	load := func(rpu int) {
		t.Helper()
		p, err := envoyrls.ParseReferenceConfig("config.yaml", []byte(strings.Replace(refChangeYAML, "RPU", fmt.Sprint(rpu), 1)))
		if err != nil {
			t.Fatal(err)
		}
		current.Store(p)
	}
	load(5)
	s := envoyrls.New(current.Load(), sluice.NewWithOptions(store, sluice.Options{Clock: clock}), envoyrls.Options{Source: current.Load})
	ask := func() rlspb.RateLimitResponse_Code {
		resp, err := s.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "abuser")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	for range 3 {
		if c := ask(); c != rlspb.RateLimitResponse_OK {
			t.Fatalf("under 5/min: %v", c)
		}
	}
	load(2)
	for i := range 3 {
		if c := ask(); c != rlspb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("call %d after 5/min with 3 used was lowered to 2/min: %v, want OVER_LIMIT", i+1, c)
		}
	}
}
