package sluice

// ShardLimit is one shard of a sharded limit, for tests that set shards
// apart.
func ShardLimit(l *Limit) *Limit { return l.shards.lim }
