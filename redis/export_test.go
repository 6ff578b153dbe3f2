package redis

import (
	"context"
	"runtime"
	"strconv"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// SetBeforeRollback makes s run f when a Cluster TakeAll has been
// rejected, before the slots it charged are refunded.
func SetBeforeRollback(s *Store, f func()) { s.beforeRollback = f }

// SetBeforeSubscribe makes every store run f before it asks Redis for
// its drops subscription, until the test ends; f's waitOver ends New's
// wait for the first subscription.
func SetBeforeSubscribe(t interface{ Cleanup(func()) }, f func(waitOver func())) {
	beforeSubscribe.Store(&f)
	t.Cleanup(func() { beforeSubscribe.Store(nil) })
}

// LoneGroup is a lone request's group, header and arguments, at now (Unix
// microseconds, as the script reads the time), as Take writes it.
func LoneGroup(op engine.Op, r sluice.Charged, now int64) []string {
	return appendRequest(appendGroup(nil, 1, opOf(op), strconv.FormatInt(now, 10)), &r, "", now)
}

// JoinRuns lays calls' groups out as the batch writer does, in runs.
func JoinRuns(calls [][]string) []string {
	cs := make([]*call, len(calls))
	for i, c := range calls {
		cs[i] = &call{args: c, keys: []string{""}}
	}
	_, args := appendCalls(nil, nil, cs)
	return args
}

// Script runs the store's script over keys and args (groups), as one
// batch.
func Script(ctx context.Context, s *Store, keys, args []string) ([]int64, error) {
	return s.exec(ctx, keys, append([]string{"0"}, args...))
}

// Batchers is the number of s's batchers not retired: the fallback
// node's and the Cluster primaries'. A retired one is counted until its
// writers have exited.
func Batchers(s *Store) int {
	s.batchMu.Lock()
	defer s.batchMu.Unlock()
	return len(s.batches)
}

// RefreshSlots reads the Cluster's slot table into s now, as a failed
// call makes it do (at most once per backoff), after any refresh in
// flight.
func RefreshSlots(s *Store) error {
	for !s.nodes.busy.CompareAndSwap(false, true) {
		runtime.Gosched()
	}
	defer s.nodes.busy.Store(false)
	return s.nodes.refresh()
}
