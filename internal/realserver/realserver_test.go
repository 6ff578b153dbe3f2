package realserver

import (
	"runtime"
	"testing"
)

// recorder is a testing.TB that records how a helper ended the test and,
// as testing's do, ends the goroutine there.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()           {}
func (r *recorder) Skip(args ...any)  { r.skipped = args[0].(string); runtime.Goexit() }
func (r *recorder) Fatal(args ...any) { r.failed = args[0].(string); runtime.Goexit() }

func (r *recorder) missing(binary, aptPackage, envURL string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		Missing(r, binary, aptPackage, envURL)
	}()
	<-done
}

// A missing server skips the test with how to get it, and fails it under
// CI=true.
func TestMissing(t *testing.T) {
	const want = "redis-server not found: install it (apt-get install redis-server) or set SLUICE_REDIS_URL"
	t.Setenv("CI", "")
	var r recorder
	r.missing("redis-server", "redis-server", "SLUICE_REDIS_URL")
	if r.skipped != want || r.failed != "" {
		t.Fatalf("without CI: skipped %q, failed %q", r.skipped, r.failed)
	}
	t.Setenv("CI", "true")
	r = recorder{}
	r.missing("redis-server", "redis-server", "SLUICE_REDIS_URL")
	if r.failed != "CI=true and "+want || r.skipped != "" {
		t.Fatalf("with CI=true: skipped %q, failed %q", r.skipped, r.failed)
	}
	if got := Message("nginx", "nginx", ""); got != "nginx not found: install it (apt-get install nginx)" {
		t.Fatalf("without a URL variable: %q", got)
	}
}
