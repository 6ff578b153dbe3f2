package redis

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
