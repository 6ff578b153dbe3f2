package envoyrls

import (
	"runtime"
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// TestAttackDeepDescriptorsCompileQuadratic: a control plane
// nests descriptors thousands deep, each level a few bytes. Compiling
// copied the path and key chain of every ancestor at every level, so a
// snapshot of some tens of kilobytes made gigabytes; no call can reach
// past maxEntries levels, so deeper nesting is refused, unread.
func TestAttackDeepDescriptorsCompileQuadratic(t *testing.T) {
	const depth = 5000
	rpu := &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1}
	var d *rlsconf.RateLimitDescriptor
	for range depth {
		d = &rlsconf.RateLimitDescriptor{Key: "k", RateLimit: rpu, Descriptors: nonNil(d)}
	}
	rc := &rlsconf.RateLimitConfig{Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{d}}
	size := proto.Size(rc)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ParseReferenceResources("xds://cp", []*rlsconf.RateLimitConfig{rc})
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	if alloc > 1000*uint64(size) {
		t.Fatalf("a %d-byte snapshot of descriptors %d deep allocated %d MiB to compile", size, depth, alloc>>20)
	}
	if err == nil || !strings.Contains(err.Error(), "deeper than") {
		t.Fatalf("descriptors %d deep: got %v, want them refused", depth, err)
	}
}

func nonNil(d *rlsconf.RateLimitDescriptor) []*rlsconf.RateLimitDescriptor {
	if d == nil {
		return nil
	}
	return []*rlsconf.RateLimitDescriptor{d}
}
