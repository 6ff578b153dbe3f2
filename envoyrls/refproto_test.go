package envoyrls

import (
	"math"
	"runtime"
	"strconv"
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
	var err error
	alloc := leastAlloc(func() { _, err = ParseReferenceResources("xds://cp", []*rlsconf.RateLimitConfig{rc}) })
	if alloc > 1000*uint64(size) {
		t.Fatalf("a %d-byte snapshot of descriptors %d deep allocated %d MiB to compile", size, depth, alloc>>20)
	}
	if err == nil || !strings.Contains(err.Error(), "deeper than") {
		t.Fatalf("descriptors %d deep: got %v, want them refused", depth, err)
	}
}

// leastAlloc is the fewest bytes the process allocated over three runs
// of f: the count is the whole process's, and a goroutine another test
// left running (a server winding down) allocates too, so one run alone
// may read its garbage as f's.
func leastAlloc(f func()) uint64 {
	least := uint64(math.MaxUint64)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

func nonNil(d *rlsconf.RateLimitDescriptor) []*rlsconf.RateLimitDescriptor {
	if d == nil {
		return nil
	}
	return []*rlsconf.RateLimitDescriptor{d}
}

// TestAttackLongKeyAboveManyDescriptors: a control plane puts one long
// domain and key above thousands of small descriptors with limits.
// Each descriptor's limit was named by hashing its whole path, the long
// key and domain included, anew, so that a 1 MiB snapshot made
// gigabytes of garbage and seconds of CPU; each now extends its parent's
// hash.
func TestAttackLongKeyAboveManyDescriptors(t *testing.T) {
	rl := &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1}
	kids := make([]*rlsconf.RateLimitDescriptor, 10000)
	for i := range kids {
		kids[i] = &rlsconf.RateLimitDescriptor{Key: "k", Value: strconv.Itoa(i), RateLimit: rl}
	}
	long := strings.Repeat("k", 256<<10)
	rc := &rlsconf.RateLimitConfig{Domain: long, Descriptors: []*rlsconf.RateLimitDescriptor{{Key: long, Descriptors: kids}}}
	size := proto.Size(rc)
	var err error
	alloc := leastAlloc(func() { _, err = ParseReferenceResources("xds://cp", []*rlsconf.RateLimitConfig{rc}) })
	if err != nil {
		t.Fatal(err)
	}
	if alloc > 100*uint64(size) {
		t.Fatalf("a %d-byte snapshot allocated %d MiB to compile", size, alloc>>20)
	}
}

// TestAttackDeepFileCheckedQuadratic: a file in the reference format
// nested thousands deep (as descriptors, or as mappings under
// "descriptors") was checked key by key and line by line with the path
// of every node, each a copy of its parent's: a 225 KB file made close to
// a gigabyte before it was refused.
func TestAttackDeepFileCheckedQuadratic(t *testing.T) {
	for _, level := range []string{"[{key: k, rate_limit: {unit: second, requests_per_unit: 1}, descriptors: ", "{descriptors: "} {
		var b strings.Builder
		b.WriteString("domain: d\ndescriptors: ")
		for range 3000 {
			b.WriteString(level)
		}
		b.WriteString("[]")
		for range 3000 {
			b.WriteString(map[bool]string{true: "}]", false: "}"}[strings.HasPrefix(level, "[")])
		}
		var err error
		if alloc := leastAlloc(func() { _, err = ParseReferenceConfig("deep.yaml", []byte(b.String())) }); alloc > 200*uint64(b.Len()) {
			t.Fatalf("a %d-byte file nested 3000 deep allocated %d MiB to check", b.Len(), alloc>>20)
		}
		if err == nil {
			t.Fatal("a file nested 3000 deep was accepted")
		}
	}
}
