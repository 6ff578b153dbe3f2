package main

import (
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestH2DriverAgainstService drives sluice's service in this process
// with the hand-framed client past the connections' first send windows
// (65,535 bytes each), so that the calls go on only if the client honours
// the server's WINDOW_UPDATEs, and checks every call was answered well.
func TestH2DriverAgainstService(t *testing.T) {
	addr, stop, err := serve("memory://", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	keys := []string{"user-0", "user-1", "user-2"}
	drive, err := h2Driver(addr, 2, keys, 1.1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l := new(load)
	l.measuring.Store(true)
	wait := drive(l, 8)
	const want = 3 * 65_535 * 2 / 30 // calls of about 30 bytes: three windows per connection
	for deadline := time.Now().Add(time.Minute); l.calls.Load() < want; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			l.stop.Store(true)
			wait()
			t.Fatalf("%d calls answered in a minute, want %d (errors %d)", l.calls.Load(), want, l.errs.Load())
		}
	}
	l.stop.Store(true)
	var n int
	for _, ls := range wait() {
		n += len(ls)
	}
	if n < want || l.errs.Load() != 0 {
		t.Fatalf("%d calls timed, %d errors; want at least %d and none", n, l.errs.Load(), want)
	}
	// Three keys at 100 a second with a burst of 100: most of the calls
	// are over the limit, whatever the machine's speed once past 300.
	if l.over.Load() == 0 {
		t.Fatalf("no call of %d was answered OVER_LIMIT", n)
	}
}

func TestOverLimit(t *testing.T) {
	frame := func(m *rlspb.RateLimitResponse) []byte {
		b, err := grpcMessage(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		name     string
		b        []byte
		over, ok bool
	}{
		{"ok", frame(&rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK}), false, true},
		{"over", frame(&rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OVER_LIMIT, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{Code: rlspb.RateLimitResponse_OVER_LIMIT}}}), true, true},
		{"unknown", frame(&rlspb.RateLimitResponse{}), false, true},
		{"short", []byte{0, 0, 0}, false, false},
		{"length", append(frame(&rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK}), 0), false, false},
		{"compressed", append([]byte{1}, frame(&rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK})[1:]...), false, false},
	} {
		if over, ok := overLimit(c.b); over != c.over || ok != c.ok {
			t.Errorf("%s: overLimit = %v, %v; want %v, %v", c.name, over, ok, c.over, c.ok)
		}
	}
}
