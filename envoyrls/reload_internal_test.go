package envoyrls

import (
	"context"
	"sync"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// A reload under load is loaded once: the calls in flight when the source
// answers a new policy all find it changed at the same moment (the source
// holds each until every one has asked), and one of them compiles it
// while the others wait for it, rather than each compiling it again.
func TestReloadLoadsOnce(t *testing.T) {
	parse := func(rps string) *policy.Policy {
		p, err := policy.Parse("p.yaml", []byte("rules:\n  - name: r\n    match: {domain: edge}\n    limit_keys: [\"descriptor:client\"]\n    algorithm_config: {rps: "+rps+", burst: 100}\n"))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	one, two := parse("1"), parse("2")
	const calls = 16
	var (
		mu      sync.Mutex
		current = one
		armed   bool
		waiting int
		open    = make(chan struct{})
	)
	source := func() *policy.Policy {
		mu.Lock()
		if !armed {
			p := current
			mu.Unlock()
			return p
		}
		if waiting++; waiting == calls {
			armed, current = false, two
			close(open)
		}
		mu.Unlock()
		<-open
		return two
	}
	s := New(one, sluice.New(memory.New(memory.Options{})), Options{Source: source})
	req := &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: "c"}}}}}
	if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	before := s.loads.Load()
	mu.Lock()
	armed = true
	mu.Unlock()
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := s.loads.Load() - before; n != 1 {
		t.Fatalf("%d calls in flight at a reload loaded the new policy %d times, want once", calls, n)
	}
	if s.loaded.Load().pol != two {
		t.Fatal("the new policy is not the one in force")
	}
}
