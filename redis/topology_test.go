package redis_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redis"
)

// An ACL user with a password: the URL's credentials are used, wrong ones
// are refused.
func TestACLUser(t *testing.T) {
	redistest.Need(t, "redis-cli", "")
	srv := redistest.New(t, "--user", "app", "on", ">s3cret", "~*", "&*", "+@all")
	lim := uniqueLimit(t, sluice.Spec{Name: "acl", TokensPerSecond: 1, Burst: 1})
	ctx := context.Background()
	s := open(t, "redis://app:s3cret@"+srv.Addr()+"/3", redis.Options{})
	if d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil || !d.Allowed {
		t.Fatalf("take as app: %v %+v", err, d)
	}
	// The key went to database 3.
	if out, _ := redistest.CLI(srv.Addr(), "-n", "3", "EXISTS", lim.StorageKey("k")); strings.TrimSpace(out) != "1" {
		t.Fatalf("key not in db 3: %q", out)
	}
	if bad, err := redis.Open("redis://app:wrong@"+srv.Addr(), redis.Options{}); err == nil {
		defer bad.Close()
		if _, err := conformance.Take(ctx, bad, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err == nil {
			t.Fatal("take with a wrong password succeeded")
		}
	}
}

// Sentinel: the store asks the sentinel for the primary of the named set.
func TestSentinel(t *testing.T) {
	primary := newStandalone(t)
	addr := redistest.Sentinel(t, "mymaster", primary)
	s := open(t, "redis+sentinel://"+addr+"/mymaster", redis.Options{})
	lim := uniqueLimit(t, sluice.Spec{Name: "sentinel", TokensPerSecond: 1, Burst: 2})
	ctx := context.Background()
	var allowed int
	for range 3 {
		d, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Fatalf("admitted %d of burst 2", allowed)
	}
	if out, _ := redistest.CLI(primary.Addr(), "EXISTS", lim.StorageKey("k")); strings.TrimSpace(out) != "1" {
		t.Fatalf("key not on the sentinel's primary: %q", out)
	}
}
