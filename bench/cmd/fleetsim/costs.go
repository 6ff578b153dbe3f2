package main

// Costs are what one decision costs each part of the fleet, in
// microseconds of one core: the model's only inputs that are not the
// fleet's shape. Every figure is measured and names its benchmark; all of
// them come from 2-core virtual machines shared with other work (the
// machine and day are with each table), so they give the fleet's order of
// size, not a specification of any other machine.
type Costs struct {
	// Door is a gateway's CPU per decision at each front door, the whole
	// decision on the memory store: the floor's CPU per call plus
	// sluice's extra, from bench/README.md#front-doors-against-their-floors
	// (frontdoor.sh, closed loop: the median floor of the runs plus the
	// median extra).
	Door map[string]float64
	// ClientExact is the gateway's extra CPU for a decision that goes to
	// Redis (the store client's work: encoding, the pipeline, decoding),
	// and ClientLocal for one answered from a slice; both per decision,
	// measured by BenchmarkHotKey (bench/hotkey_test.go: the benchmark
	// process's own CPU per decision, exact and leased; the load loop is
	// in it and counted).
	ClientExact, ClientLocal float64
	// RedisExact is a Redis primary's CPU per exact decision on keys
	// spread over many: BenchmarkRedis, sluice-nocache at 16 goroutines
	// (bench/README.md#redis-store). A gateway's pipeline to one primary
	// carries fewer calls at once than the 64 goroutines of the
	// benchmark's busiest rows, so it batches less; and the traffic the
	// model sizes is admitted, which the over-limit cache does not save.
	RedisExact float64
	// RedisHotExact is the same on one hot key, RedisLease per slice
	// taken or returned (a take or a refund of the slice's leftover), and
	// RedisSharded per decision of a sharded limit (a read of two shards
	// and a charge): BenchmarkHotKey, each Redis CPU per decision or per
	// slice operation in one run.
	RedisHotExact, RedisLease, RedisSharded float64
	// LeaseOpsPerSlice is the store operations per slice taken (the take,
	// and a return when it ends with tokens left): BenchmarkHotKey's
	// count of takes and returns.
	LeaseOpsPerSlice float64
}

// measured is the cost table. Change a figure only with the run it comes
// from, in bench/README.md.
var measured = Costs{
	Door: map[string]float64{
		"auth": 12.9 + 0.68,
		"take": 13.5 + 0.62,
		"grpc": 8.45 + 2.40,
	},
	ClientExact:      pendingClientExact,
	ClientLocal:      pendingClientLocal,
	RedisExact:       6.0,
	RedisHotExact:    pendingRedisHotExact,
	RedisLease:       pendingRedisLease,
	RedisSharded:     pendingRedisSharded,
	LeaseOpsPerSlice: pendingLeaseOps,
}

// Placeholders until BenchmarkHotKey has run (see bench/README.md).
const (
	pendingClientExact   = 5.0
	pendingClientLocal   = 0.2
	pendingRedisHotExact = 6.0
	pendingRedisLease    = 12.0
	pendingRedisSharded  = 10.0
	pendingLeaseOps      = 2.0
	defaultHotAfter      = 16
)
