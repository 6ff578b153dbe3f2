package redis_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redis"
)

// An ACL user with a password: the URL's credentials are used, wrong ones
// are refused.
func TestACLUser(t *testing.T) {
	needBinary(t, "redis-server", "")
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := startServer(ports[0], t.TempDir(), "--user", "app", "on", ">s3cret", "~*", "&*", "+@all")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.stop)
	lim := uniqueLimit(t, sluice.Spec{Name: "acl", TokensPerSecond: 1, Burst: 1})
	ctx := context.Background()
	s := open(t, "redis://app:s3cret@"+srv.addr()+"/3", redis.Options{})
	if d, err := s.Take(ctx, sluice.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil || !d.Allowed {
		t.Fatalf("take as app: %v %+v", err, d)
	}
	// The key went to database 3.
	if out, _ := cli(srv.addr(), "-n", "3", "EXISTS", sluice.StorageKey(lim, "k")); strings.TrimSpace(out) != "1" {
		t.Fatalf("key not in db 3: %q", out)
	}
	if bad, err := redis.Open("redis://app:wrong@"+srv.addr(), redis.Options{}); err == nil {
		defer bad.Close()
		if _, err := bad.Take(ctx, sluice.OpTake, sluice.Request{Limit: lim, Key: "k"}); err == nil {
			t.Fatal("take with a wrong password succeeded")
		}
	}
}

// Sentinel: the store asks the sentinel for the primary of the named set.
func TestSentinel(t *testing.T) {
	needBinary(t, "redis-server", "")
	primary := newStandalone(t)
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %d 1\nsentinel down-after-milliseconds mymaster 1000\n", ports[0], dir, primary.port)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	log, _ := os.Create(filepath.Join(dir, "sentinel.log"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := cli(addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
		if err == nil && strings.Contains(out, fmt.Sprint(primary.port)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel not ready: %v %s", err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s := open(t, "redis+sentinel://"+addr+"/mymaster", redis.Options{})
	lim := uniqueLimit(t, sluice.Spec{Name: "sentinel", TokensPerSecond: 1, Burst: 2})
	ctx := context.Background()
	var allowed int
	for range 3 {
		d, err := s.Take(ctx, sluice.OpTake, sluice.Request{Limit: lim, Key: "k"})
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
	if out, _ := cli(primary.addr(), "EXISTS", sluice.StorageKey(lim, "k")); strings.TrimSpace(out) != "1" {
		t.Fatalf("key not on the sentinel's primary: %q", out)
	}
}
