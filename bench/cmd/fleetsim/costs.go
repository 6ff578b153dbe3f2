package main

import "github.com/sluicehq/sluice/quota"

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
	// (frontdoor.sh, closed loop, on the 2-core Intel Xeon: the middle of
	// the floor's range plus the median extra).
	Door map[string]float64
	// ClientExact is the gateway's extra CPU for a decision that goes to
	// Redis (the Limiter and the store client: encoding, the pipeline,
	// decoding) and ClientLocal for one answered from a slice:
	// BenchmarkHotKey's closed part, the benchmark process's own CPU per
	// decision in the exact and leased modes (its load loop counted in),
	// bench/README.md#a-hot-key-exact-leased-and-sharded.
	ClientExact, ClientLocal float64
	// RedisExact is a Redis primary's CPU per exact decision on keys
	// spread over many: BenchmarkRedis, sluice-nocache at 16 goroutines
	// (bench/README.md#redis-store). A gateway's pipeline to one primary
	// carries fewer calls at once than the benchmark's busiest rows, so
	// it batches less; and the traffic the model sizes is admitted, which
	// the over-limit cache does not save.
	RedisExact float64
	// RedisHotExact is the same on one hot key (BenchmarkHotKey's closed
	// part, exact mode, 96 callers batched), RedisSharded per decision of
	// a sharded limit (the same part, sharded mode: a read of two shards
	// and a charge), and RedisLease per slice taken (a take that no other
	// call rides with: BenchmarkHotKey's same-traffic part, exact mode,
	// whose calls go one by one).
	RedisHotExact, RedisSharded, RedisLease float64
	// LeaseOpsPerSlice is the store calls per slice taken: the take, and
	// a return when the slice ends with tokens left (BenchmarkHotKey's
	// slices-returned: none returned on a hot key, whose slices run out).
	LeaseOpsPerSlice float64
}

// measured is the cost table. Change a figure only with the run it comes
// from, in bench/README.md; the BenchmarkHotKey figures are its run 1
// of 2026-11-27 there.
var measured = Costs{
	Door: map[string]float64{
		"auth": 12.9 + 0.68,
		"take": 13.5 + 0.62,
		"grpc": 8.45 + 2.40,
	},
	ClientExact:      6.29,
	ClientLocal:      0.36,
	RedisExact:       6.0,
	RedisHotExact:    5.95,
	RedisSharded:     17.26,
	RedisLease:       28.84,
	LeaseOpsPerSlice: 1,
}

// defaultHotAfter is quota.DefaultHotAfter.
const defaultHotAfter = quota.DefaultHotAfter
