package policy_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// fakeSource is a policy.Source whose loads the test scripts: each Load
// takes the next result, and the test pokes through poke.
type fakeSource struct {
	poke    chan string
	results chan fakeResult
	forced  chan bool // what each Load was asked
	stopped chan struct{}
}

type fakeResult struct {
	p   *policy.Policy
	err error
}

func newFakeSource() *fakeSource {
	return &fakeSource{poke: make(chan string), results: make(chan fakeResult, 1), forced: make(chan bool, 1), stopped: make(chan struct{})}
}

func (s *fakeSource) Load(ctx context.Context, force bool) (*policy.Policy, error) {
	s.forced <- force
	r := <-s.results
	return r.p, r.err
}

func (s *fakeSource) Watch(ctx context.Context, changed func(string)) {
	defer close(s.stopped)
	for {
		select {
		case <-ctx.Done():
			return
		case why := <-s.poke:
			changed(why)
		}
	}
}

// The watcher installs what a load returns, reports it, keeps the policy
// in force when a load fails, says nothing when a load finds no change,
// forces a load on demand, and stops with its source.
func TestWatch(t *testing.T) {
	src := newFakeSource()
	now := make(chan string)
	installed := make(chan *policy.Policy, 8)
	reports := make(chan policy.Reload, 8)
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		policy.Watch(ctx, src, now, func(p *policy.Policy) { installed <- p }, func(r policy.Reload) { reports <- r })
	}()
	wait := func(what string, c <-chan policy.Reload) policy.Reload {
		t.Helper()
		select {
		case r := <-c:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("no report of %s", what)
		}
		return policy.Reload{}
	}
	load := func(why string, force bool, r fakeResult) {
		t.Helper()
		if force {
			now <- why
		} else {
			src.poke <- why
		}
		if got := <-src.forced; got != force {
			t.Fatalf("%s: Load(force=%v), want %v", why, got, force)
		}
		src.results <- r
	}

	p1 := &policy.Policy{Source: "one"}
	load("file changed", false, fakeResult{p: p1})
	if r := wait("a change", reports); r.Policy != p1 || r.Err != nil || r.Why != "file changed" {
		t.Fatalf("report %+v", r)
	}
	if p := <-installed; p != p1 {
		t.Fatalf("installed %v", p)
	}

	// A refused load installs nothing and is reported with its error.
	bad := errors.New("bad.yaml:3: rules[0].burst: must be > 0")
	load("file changed", false, fakeResult{err: bad})
	if r := wait("a refusal", reports); r.Err != bad || r.Policy != nil {
		t.Fatalf("report %+v", r)
	}

	// A load that finds nothing new is not reported.
	load("timer", false, fakeResult{})
	// SIGHUP forces a load.
	p2 := &policy.Policy{Source: "two"}
	load("SIGHUP", true, fakeResult{p: p2})
	if r := wait("a forced load", reports); r.Policy != p2 || r.Why != "SIGHUP" {
		t.Fatalf("report %+v (the unchanged load before it must not be reported)", r)
	}
	if p := <-installed; p != p2 {
		t.Fatalf("installed %v; the refused load must install nothing", p)
	}
	select {
	case p := <-installed:
		t.Fatalf("installed %v beyond the two good loads", p)
	default:
	}

	cancel()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return after its context ended")
	}
	select {
	case <-src.stopped:
	default:
		t.Fatal("Watch returned before its source's Watch did")
	}
}

// A File's change is loaded once two polls have seen the same content;
// an unreadable file is skipped quietly unless forced; content that was
// refused is not loaded again until it changes.
func TestFileSource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	const v1 = "rules:\n  - name: a\n    algorithm_config: {rps: 1, burst: 1}\n"
	if err := os.WriteFile(path, []byte(v1), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &policy.File{Path: path}
	ctx := context.Background()
	p, err := f.Load(ctx, true)
	if err != nil || p.Rule("a") == nil {
		t.Fatalf("first load: %v %v", p, err)
	}
	if p, err := f.Load(ctx, false); p != nil || err != nil {
		t.Fatalf("an unchanged file loaded: %v %v", p, err)
	}
	v2 := strings.Replace(v1, "name: a", "name: b", 1)
	os.WriteFile(path, []byte(v2), 0o644)
	if p, err := f.Load(ctx, false); p != nil || err != nil {
		t.Fatalf("a change seen once loaded: %v %v", p, err)
	}
	if p, err := f.Load(ctx, false); err != nil || p == nil || p.Rule("b") == nil {
		t.Fatalf("a change seen twice: %v %v", p, err)
	}

	// Invalid content is refused once, then left alone until it changes.
	os.WriteFile(path, []byte("rules:\n  - name: c\n    bogus: 1\n"), 0o644)
	f.Load(ctx, false)
	if _, err := f.Load(ctx, false); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("invalid content: %v", err)
	}
	if p, err := f.Load(ctx, false); p != nil || err != nil {
		t.Fatalf("refused content loaded again: %v %v", p, err)
	}

	// A forced load (SIGHUP) of what is in force is no change; of the
	// same bytes after a refusal it is, and so is a variable the file
	// reads that changed.
	good := "api_token_env: SLUICE_TEST_RELOAD_TOKEN\n" + v2
	t.Setenv("SLUICE_TEST_RELOAD_TOKEN", "0123456789abcdef")
	os.WriteFile(path, []byte(good), 0o644)
	if p, err := f.Load(ctx, true); err != nil || p == nil {
		t.Fatalf("forced load of a changed file: %v %v", p, err)
	}
	if p, err := f.Load(ctx, true); p != nil || err != nil {
		t.Fatalf("forced load of an unchanged file: %v %v", p, err)
	}
	t.Setenv("SLUICE_TEST_RELOAD_TOKEN", "")
	if _, err := f.Load(ctx, true); err == nil {
		t.Fatal("an unset token variable loaded")
	}
	t.Setenv("SLUICE_TEST_RELOAD_TOKEN", "0123456789abcdef")
	if p, err := f.Load(ctx, true); err != nil || p == nil {
		t.Fatalf("forced load after a refusal: %v %v", p, err)
	}
	t.Setenv("SLUICE_TEST_RELOAD_TOKEN", "fedcba9876543210")
	if p, err := f.Load(ctx, true); err != nil || p == nil {
		t.Fatalf("forced load with a changed variable: %v %v", p, err)
	}

	os.Remove(path)
	if p, err := f.Load(ctx, false); p != nil || err != nil {
		t.Fatalf("a vanished file on a poll: %v %v", p, err)
	}
	if _, err := f.Load(ctx, true); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("a vanished file on demand: %v", err)
	}

	// Parse chooses the format.
	os.WriteFile(path, []byte(v1), 0o644)
	f = &policy.File{Path: path, Parse: func(name string, data []byte) (*policy.Policy, error) {
		return &policy.Policy{Source: "custom " + name}, nil
	}}
	if p, err := f.Load(ctx, true); err != nil || p.Source != "custom "+path {
		t.Fatalf("custom parse: %v %v", p, err)
	}
}
