package envoyrls_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// recyclePolicy gives every user value a bucket of its own, refilled by
// nothing on a manual clock: the n-th call of a value leaves recycleBurst-n.
const (
	recycleBurst  = 1000
	recyclePolicy = "rules:\n  - name: per-user\n    match: {domain: d}\n    limit_keys: [\"descriptor:user\"]\n    algorithm_config: {rate: 1, period: 1h, capacity: 1000}\n"
)

// serveRecycle serves recyclePolicy on a server with opts and returns a
// client of it.
func serveRecycle(t *testing.T, opts ...grpc.ServerOption) rlspb.RateLimitServiceClient {
	t.Helper()
	pol, err := policy.Parse("recycle", []byte(recyclePolicy))
	if err != nil {
		t.Fatal(err)
	}
	clock := sluice.NewManualClock(t0)
	return startWith(t, pol, memory.New(memory.Options{Clock: clock}), clock, opts...).rls
}

func userCall(user string) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
	}}}
}

// checkOwn reports whether resp is the answer to the n-th call (from 1) of
// user's bucket, in its status and in its RateLimit header.
func checkOwn(resp *rlspb.RateLimitResponse, n int) error {
	want := recycleBurst - n
	if resp.OverallCode != OK || len(resp.Statuses) != 1 || resp.Statuses[0].LimitRemaining != uint32(want) {
		return fmt.Errorf("call %d: %v, want OK with %d remaining", n, resp, want)
	}
	if got := header(resp, "Ratelimit-Remaining"); got != strconv.Itoa(want) {
		return fmt.Errorf("call %d: Ratelimit-Remaining %q, want %d", n, got, want)
	}
	return nil
}

// Responses answered in recycled memory (the server's own options and
// codec) each carry their own call's answer while many calls are in flight
// at once: a response given back before it was sent, or reused while
// another call still writes it, would answer one caller with another's
// bucket (and fail under -race).
func TestRecycledResponsesAnswerTheirOwnCall(t *testing.T) {
	rls := serveRecycle(t, envoyrls.ServerOptions()...)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			user := "user-" + strconv.Itoa(w)
			for n := 1; n <= 50+10*w; n++ { // callers progress apart
				resp, err := rls.ShouldRateLimit(context.Background(), userCall(user))
				if err == nil {
					err = checkOwn(resp, n)
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", user, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// An interceptor is handed a response it may keep: it is never one whose
// memory goes back for another call's. What an interceptor kept from the
// first call is still the first call's answer after many more.
func TestInterceptorKeepsItsResponse(t *testing.T) {
	var kept []proto.Message
	var mu sync.Mutex
	keep := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if m, ok := resp.(proto.Message); ok {
			mu.Lock()
			kept = append(kept, m)
			mu.Unlock()
		}
		return resp, err
	}
	rls := serveRecycle(t, append(envoyrls.ServerOptions(), grpc.UnaryInterceptor(keep))...)
	for n := 1; n <= 20; n++ {
		resp, err := rls.ShouldRateLimit(context.Background(), userCall("u"))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkOwn(resp, n); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	first, ok := kept[0].(*rlspb.RateLimitResponse)
	if !ok {
		t.Fatalf("the interceptor was handed a %T, not the response itself", kept[0])
	}
	if err := checkOwn(first, 1); err != nil {
		t.Errorf("the response the interceptor kept changed: %v", err)
	}
}

// A call decoded into memory that an earlier call used keeps nothing of
// it: a caller that sends many descriptors, then one that sends a single
// one, must not have the first's leftover descriptors charged to its
// call, nor its hits_addend, nor be charged under the first's values.
// Alternating calls of the two shapes, each answers exactly its own
// descriptors at its own cost.
func TestAttackRecycledRequestKeepsNoEarlierDescriptors(t *testing.T) {
	rls := serveRecycle(t, envoyrls.ServerOptions()...)
	wide := &rlspb.RateLimitRequest{Domain: "d", HitsAddend: 2}
	for i := range 5 {
		wide.Descriptors = append(wide.Descriptors, &rlv3.RateLimitDescriptor{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "wide-" + strconv.Itoa(i)}},
		})
	}
	for n := 1; n <= 40; n++ {
		resp, err := rls.ShouldRateLimit(context.Background(), wide)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Statuses) != 5 {
			t.Fatalf("call %d: %d statuses for 5 descriptors", n, len(resp.Statuses))
		}
		// The narrow caller's n-th call: its bucket alone, once per call.
		resp, err = rls.ShouldRateLimit(context.Background(), userCall("narrow"))
		if err == nil {
			err = checkOwn(resp, n)
		}
		if err != nil {
			t.Fatalf("the narrow caller after a wide one: %v", err)
		}
	}
	// And the wide caller's buckets were charged only by its own calls.
	resp, err := rls.ShouldRateLimit(context.Background(), wide)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range resp.Statuses {
		if st.LimitRemaining != recycleBurst-2*41 {
			t.Errorf("wide-%d: %d remaining after 41 calls of 2 hits, want %d", i, st.LimitRemaining, recycleBurst-2*41)
		}
	}
}
