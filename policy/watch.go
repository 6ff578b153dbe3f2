package policy

import (
	"context"
	"crypto/sha256"
	"os"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/defaults"
	"github.com/sluicehq/sluice/internal/tick"
)

// Source is where a policy comes from and how it learns that it may have
// changed: a File, a file merged with PostgreSQL's rules table
// (postgres.PolicySource), or a file in envoyproxy/ratelimit's format (a
// File whose Parse is envoyrls.Parser's). Watch keeps a running policy
// in step with one.
type Source interface {
	// Load returns the source's policy when it differs from what the
	// previous Load saw, and nil, nil when nothing changed. With force it
	// reads and compiles the source whatever it looks like (a reload on
	// demand). An error refuses what the source now holds: the caller
	// keeps the policy in force.
	Load(ctx context.Context, force bool) (*Policy, error)
	// Watch calls changed whenever the source may have changed (a poll's
	// tick, a database's notification), saying why, until ctx is done.
	// changed does not block; Watch returns once ctx is done.
	Watch(ctx context.Context, changed func(why string))
}

// Reload is what one load of a source that found a change came to.
type Reload struct {
	// Why says what asked for the load ("file changed", "SIGHUP", "rules
	// table changed").
	Why string
	// Policy is the policy installed; nil when the load was refused.
	Policy *Policy
	// Err says why the load was refused (the policy in force stays).
	Err error
	// Unchanged says that a load on demand found nothing new: Policy and
	// Err are nil, nothing was installed, and it is no reload.
	Unchanged bool
}

// Watch keeps a running policy in step with src until ctx is done: each
// time src may have changed, and each time now delivers (a reload on
// demand, such as SIGHUP, whose value is the why), it loads src and gives
// a new policy to install. A load that fails installs nothing, so the last
// good policy keeps serving. report, when not nil, is told of every load
// that found a change, installed or refused, and of every load on demand
// that found nothing new (Reload.Unchanged); a poll that found nothing new
// is not reported. Loads run one at a time, in this goroutine; the
// source's first policy is the caller's to load and install.
func Watch(ctx context.Context, src Source, now <-chan string, install func(*Policy), report func(Reload)) {
	// One pending poke is enough: the load it starts sees every change
	// made before it, whichever poke asked.
	pokes := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		src.Watch(ctx, func(why string) {
			select {
			case pokes <- why:
			default:
			}
		})
	}()
	defer func() { <-done }()
	for {
		var why string
		force := false
		select {
		case <-ctx.Done():
			return
		case why = <-now:
			force = true
		case why = <-pokes:
		}
		p, err := src.Load(ctx, force)
		switch {
		case err != nil:
			if report != nil {
				report(Reload{Why: why, Err: err})
			}
		case p != nil:
			install(p)
			if report != nil {
				report(Reload{Why: why, Policy: p})
			}
		case force && report != nil:
			report(Reload{Why: why, Unchanged: true})
		}
	}
}

// File is a policy file as a Source: Watch polls its content, and Load
// compiles it once a change has settled.
type File struct {
	// Path is the file's path.
	Path string
	// Parse compiles the file's content (default: Parse, sluice's format;
	// envoyrls.Parser also reads envoyproxy/ratelimit's).
	Parse func(name string, data []byte) (*Policy, error)
	// Poll is how often Watch looks at the file (default 1s).
	Poll time.Duration

	mu      sync.Mutex
	sum     [32]byte // of the content Read last returned
	pending [32]byte // of the content the last poll saw
	loaded  [32]byte // Policy.digest of the policy Load last returned
}

// Read returns the file's content when it differs from what Read last
// returned and two polls in a row have seen it, so that a file caught
// half-written is not refused, or worse applied, before its writer
// finishes; nil, nil otherwise. A file that cannot be read is taken to be
// in the middle of a replacement (it may vanish for a moment), and the
// next poll looks again. With force it returns the content as it is, and
// an unreadable file is an error naming it.
func (f *File) Read(force bool) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, err := os.ReadFile(f.Path)
	if err != nil {
		if force {
			return nil, &Errors{List: []error{&Error{File: f.Path, Msg: err.Error()}}}
		}
		return nil, nil
	}
	s := sha256.Sum256(data)
	if !force {
		if s == f.sum {
			f.pending = s
			return nil, nil
		}
		if s != f.pending {
			f.pending = s
			return nil, nil
		}
	}
	// Even when what it holds is refused, this content has been seen:
	// it is not loaded again until it changes.
	f.sum, f.pending = s, s
	return data, nil
}

// ParseData compiles data as the file's content.
func (f *File) ParseData(data []byte) (*Policy, error) {
	if f.Parse == nil {
		return Parse(f.Path, data)
	}
	return f.Parse(f.Path, data)
}

// Load implements Source: the file compiled, when Read returns content
// that compiles to something new. A forced load (SIGHUP) of a file, key
// files and variables that have not changed since the policy Load last
// returned, with no refusal since, is no change: nil, nil.
func (f *File) Load(_ context.Context, force bool) (*Policy, error) {
	data, err := f.Read(force)
	if err != nil || data == nil {
		return nil, err
	}
	p, err := f.ParseData(data)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		// The next good load is news even when it is the policy in
		// force: it ends the refusals.
		f.loaded = [32]byte{}
		return nil, err
	}
	if p.digest != ([32]byte{}) && p.digest == f.loaded {
		return nil, nil
	}
	f.loaded = p.digest
	return p, nil
}

// Watch implements Source: a poke every Poll, for Load to look at the
// file.
func (f *File) Watch(ctx context.Context, changed func(why string)) {
	poll := f.Poll
	defaults.Set(&poll, time.Second)
	tick.Every(ctx, poll, func() { changed("file changed") })
}
