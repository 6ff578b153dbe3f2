package redis

// SetBeforeRollback makes s run f when a Cluster TakeAll has been
// rejected, before the slots it charged are refunded.
func SetBeforeRollback(s *Store, f func()) { s.beforeRollback = f }
