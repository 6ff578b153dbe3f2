package main

import (
	"fmt"
	"math"
	"strconv"
)

// The modes a fleet's limits may run in.
const (
	Exact   = "exact"   // every decision one store call
	Leased  = "leased"  // hot keys answered from slices of their budget
	Sharded = "sharded" // the hot key kept in Shards buckets (Spec.Shards)
)

// Fleet is the shape of a fleet and its traffic.
//
// The traffic: Rate decisions a second, spread evenly over the gateways
// (a load balancer's round robin), each decision charging one key. A
// share HotShare of them charges one global key ("hot"); the rest charge
// Keys keys with Zipf weights (key i, from 1, draws a share proportional
// to 1/i^Zipf). Every key's limit is a token bucket whose rate is
// Headroom times the traffic it gets, with a burst of one second of it:
// the fleet is sized for traffic under its limits. (Traffic over a limit
// is answered by the Redis store's over-limit cache, which costs the
// store little: bench/README.md#redis-store, sluice against
// sluice-nocache.)
type Fleet struct {
	Rate      float64
	Door      string
	Gateways  int
	Cores     int // per gateway
	Primaries int
	Keys      int
	Zipf      float64
	HotShare  float64
	Headroom  float64

	Mode string
	// Shards is the hot key's shards in the sharded mode.
	Shards int
	// MaxSlice is a slice's largest size, a share of the key's capacity
	// (lease.max_slice); Term its lifetime in seconds (lease.term);
	// HotAfter the decisions of one key in one gateway within one term
	// before the key leases (lease.hot_after).
	MaxSlice float64
	Term     float64
	HotAfter float64

	Costs Costs
}

// Primary is one Redis primary's load.
type Primary struct {
	OpsPerS float64 // store operations a second
	CPU     float64 // its one core's busy share: 1 is saturated
	// Decisions is the decisions a second whose answer waits for this
	// primary; Sojourn the mean time such a wait takes, in µs.
	Decisions, Sojourn float64
}

// Result is what the model finds for a Fleet.
type Result struct {
	Fleet
	Offered, Served float64
	// GatewayCPU is each gateway's cores' busy share; GatewayUs the CPU
	// per decision on a gateway.
	GatewayCPU, GatewayUs float64
	Primaries             []Primary
	Busiest               int // the index of the busiest primary
	StoreOps              float64
	// ToStore is the share of decisions whose answer waits for a store
	// call (each adds the network's round trip, which the latency leaves
	// out).
	ToStore float64
	// P99 is the decisions' 99th percentile latency in µs, queueing and
	// CPU only (no network): +Inf when a stage is saturated.
	P99 float64
	// LeasedKeys is how many keys lease; Overshoot the worst admission
	// beyond the exact limit over any interval, as a share of that key's
	// capacity, and OvershootTokens the same in tokens; Bound the bound
	// the settings state (gateways x max_slice), as a share.
	// Unfit says that Plan found no number of primaries that fits.
	Unfit bool

	LeasedKeys                 int
	Overshoot, OvershootTokens float64
	Bound                      float64
}

// keyLoad is one key's traffic and what it asks of the store.
type keyLoad struct {
	slot  int
	rate  float64 // decisions a second
	cpu   float64 // store CPU µs per decision, on average
	ops   float64 // store calls per decision, on average
	store float64 // share of its decisions that wait for the store
	// wait is the store CPU µs of one call its decisions wait for.
	wait float64
	// shards spreads the key's store work over this many slots, from
	// slot on, evenly over the slot range (a sharded limit's keys).
	shards int
}

const clusterSlots = 16384

// Model computes f's steady state. The queueing model: each gateway is
// an M/M/c queue of its Cores, serving each decision in GatewayUs of CPU;
// each Redis primary is an M/M/1 queue (Redis runs commands on one core)
// serving each call in the CPU it costs; a decision's p99 is the sum of
// the gateway's p99 and the p99 of the store wait of the decisions (zero
// for those answered locally), which bounds the p99 of their sum from
// above. Keys lie on primaries as on a Redis Cluster whose primaries hold
// even ranges of slots (redis-cli --cluster create): key k in slot
// CRC16(k) mod 16384. A saturated primary serves its share of the
// traffic at the rate it can (its keys' decisions slowed by its
// overload), a saturated gateway all of it.
func Model(f Fleet) (*Result, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	r := &Result{Fleet: f, Offered: f.Rate}
	slots := f.slots(r)
	r.place(slots)
	return r, nil
}

// slotLoad is the keys of one Cluster slot, summed.
type slotLoad struct {
	rate, cpu, ops, waiting, waited float64
}

// slots returns every slot's load and sets r's gateway cost and
// overshoot.
func (f Fleet) slots(r *Result) []slotLoad {
	s := make([]slotLoad, clusterSlots)
	local := 0.0
	for _, k := range f.loads(r) {
		spread := max(k.shards, 1)
		share := k.rate / float64(spread)
		for i := range spread {
			l := &s[(k.slot+i*clusterSlots/spread)%clusterSlots]
			l.rate += share
			l.cpu += share * k.cpu / 1e6
			l.ops += share * k.ops
			l.waiting += share * k.store
			l.waited += share * k.store * k.wait
		}
		local += k.rate * (1 - k.store)
	}
	c := f.Costs
	share := local / f.Rate
	r.GatewayUs = c.Door[f.Door] + share*c.ClientLocal + (1-share)*c.ClientExact
	return s
}

// place lays the slots on r.Primaries primaries and computes the loads,
// the traffic served and the latency.
func (r *Result) place(slots []slotLoad) {
	n := r.Fleet.Primaries
	r.Primaries = make([]Primary, n)
	r.Busiest, r.StoreOps, r.ToStore = 0, 0, 0
	for i, l := range slots {
		p := &r.Primaries[i*n/clusterSlots]
		p.CPU += l.cpu
		p.OpsPerS += l.ops
		p.Decisions += l.waiting
		p.Sojourn += l.waited
	}
	for i := range r.Primaries {
		p := &r.Primaries[i]
		r.StoreOps += p.OpsPerS
		r.ToStore += p.Decisions
		if p.CPU > r.Primaries[r.Busiest].CPU {
			r.Busiest = i
		}
		if p.Decisions > 0 {
			p.Sojourn /= p.Decisions
			if p.CPU < 1 {
				p.Sojourn /= 1 - p.CPU
			} else {
				p.Sojourn = math.Inf(1)
			}
		}
	}
	served := 0.0
	for i, l := range slots {
		served += l.rate / max(1, r.Primaries[i*n/clusterSlots].CPU)
	}
	r.ToStore /= r.Rate
	perGateway := r.Rate / float64(r.Gateways)
	r.GatewayCPU = perGateway * r.GatewayUs / 1e6 / float64(r.Cores)
	r.Served = served / max(1, r.GatewayCPU)
	r.P99 = mmcP99(perGateway, r.GatewayUs, r.Cores) + storeP99(r.Primaries, r.Rate)
}

func (f Fleet) check() error {
	switch {
	case f.Rate <= 0 || f.Gateways < 1 || f.Cores < 1 || f.Primaries < 1 || f.Primaries > clusterSlots || f.Keys < 0:
		return fmt.Errorf("the fleet needs a rate above 0, at least one gateway, core and primary (at most %d primaries)", clusterSlots)
	case f.HotShare < 0 || f.HotShare > 1 || (f.Keys == 0 && f.HotShare < 1):
		return fmt.Errorf("the hot share must be in [0, 1], and 1 without other keys (got %v)", f.HotShare)
	case f.Zipf < 0 || f.Headroom < 1:
		return fmt.Errorf("zipf must be >= 0 and headroom >= 1 (got %v, %v)", f.Zipf, f.Headroom)
	case f.Costs.Door[f.Door] == 0:
		return fmt.Errorf("no measured cost for the door %q", f.Door)
	case f.Mode == Sharded && (f.Shards < 2 || f.Shards > 1024):
		return fmt.Errorf("the sharded mode needs 2 to 1024 shards (got %d)", f.Shards)
	case f.Mode == Leased && (f.MaxSlice <= 0 || f.MaxSlice > 1 || f.Term <= 0 || f.HotAfter < 0):
		return fmt.Errorf("the leased mode needs max_slice in (0, 1], a term above 0 and hot_after >= 0")
	case f.Mode != Exact && f.Mode != Leased && f.Mode != Sharded:
		return fmt.Errorf("mode %q: want exact, leased or sharded", f.Mode)
	}
	return nil
}

// loads returns every key's load, and sets r's overshoot.
func (f Fleet) loads(r *Result) []keyLoad {
	c := f.Costs
	keys := make([]keyLoad, 0, f.Keys+1)
	if f.HotShare > 0 {
		k := f.key("global", f.Rate*f.HotShare, c.RedisHotExact, r)
		if f.Mode == Sharded {
			k.cpu, k.wait, k.ops, k.shards = c.RedisSharded, c.RedisSharded, 2, f.Shards
		}
		keys = append(keys, k)
	}
	if f.Keys > 0 {
		norm := 0.0
		for i := 1; i <= f.Keys; i++ {
			norm += math.Pow(float64(i), -f.Zipf)
		}
		rest := f.Rate * (1 - f.HotShare)
		for i := 1; i <= f.Keys; i++ {
			keys = append(keys, f.key("user:"+strconv.Itoa(i), rest*math.Pow(float64(i), -f.Zipf)/norm, c.RedisExact, r))
		}
	}
	if f.Mode == Leased {
		r.Bound = float64(f.Gateways) * f.MaxSlice
	}
	return keys
}

// key is the load of one key taking rate decisions a second, each
// costing exact µs of store CPU when it goes to the store. In the leased
// mode a key that one gateway sees at least HotAfter times a term leases:
// its slices settle at about what a gateway uses in half a term (a slice
// used up within half its term doubles, one ended more than half unused
// halves), from 2 tokens up to MaxSlice of its capacity; the store sees
// LeaseOpsPerSlice operations per slice, and the decisions that wait are
// the ones that find their gateway's slice empty, one a slice. Every
// gateway holds a slice of a leased key, so its worst overshoot is
// Gateways x its slice.
func (f Fleet) key(name string, rate, exact float64, r *Result) keyLoad {
	k := keyLoad{slot: int(crc16(name) % clusterSlots), rate: rate, cpu: exact, ops: 1, store: 1, wait: exact}
	if f.Mode != Leased || rate == 0 {
		return k
	}
	perGateway := rate / float64(f.Gateways)
	capacity := rate * f.Headroom // a second of the limit's rate
	most := math.Floor(f.MaxSlice * capacity)
	if perGateway*f.Term < f.HotAfter || most < 2 {
		return k
	}
	slice := min(most, max(2, math.Floor(perGateway*f.Term/2)))
	c := f.Costs
	k.store = 1 / slice
	k.cpu = c.LeaseOpsPerSlice * c.RedisLease / slice
	k.ops = c.LeaseOpsPerSlice / slice
	k.wait = c.RedisLease
	r.LeasedKeys++
	if over := float64(f.Gateways) * slice; over/capacity > r.Overshoot {
		r.Overshoot, r.OvershootTokens = over/capacity, over
	}
	return k
}

// mmcP99 is the 99th percentile of the time a decision spends in an
// M/M/c queue (arrivals lambda a second, service us µs on average, c
// servers): the service time plus the wait's 99th percentile, from Erlang
// C (P(wait > t) = C exp(-(c mu - lambda) t)). +Inf when saturated.
func mmcP99(lambda, us float64, c int) float64 {
	mu := 1e6 / us
	a := lambda / mu
	if a >= float64(c) {
		return math.Inf(1)
	}
	// Erlang B by its recurrence, then C.
	b := 1.0
	for i := 1; i <= c; i++ {
		b = a * b / (float64(i) + a*b)
	}
	rho := a / float64(c)
	erlangC := b / (1 - rho*(1-b))
	wait := 0.0
	if erlangC > 0.01 {
		wait = math.Log(erlangC/0.01) / (float64(c)*mu - lambda) * 1e6
	}
	return us + wait
}

// storeP99 is the 99th percentile of the store wait over all decisions:
// zero for those answered locally, exponential with each primary's mean
// sojourn for those that wait for it (an M/M/1 queue's sojourn time is
// exponential), found by bisection on the mixture's tail.
func storeP99(ps []Primary, rate float64) float64 {
	tail := func(t float64) float64 {
		s := 0.0
		for _, p := range ps {
			if p.Decisions > 0 {
				s += p.Decisions / rate * math.Exp(-t/p.Sojourn)
			}
		}
		return s
	}
	if tail(0) <= 0.01 {
		return 0
	}
	lo, hi := 0.0, 1.0
	for tail(hi) > 0.01 {
		hi *= 2
		if math.IsInf(hi, 1) || hi > 1e12 {
			return math.Inf(1)
		}
	}
	for range 60 {
		mid := (lo + hi) / 2
		if tail(mid) > 0.01 {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// crc16 is Redis Cluster's key hash (CRC16-CCITT, XMODEM), as sluice's
// shards compute it.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// Plan finds the fewest gateways and then the fewest primaries (up to
// most) that serve f.Rate with every gateway's cores and every
// primary's core at most target busy. With bound above 0 the leased
// mode's max slice is set to bound / gateways, so that the stated
// overshoot is the bound. The error says why no fleet fits: a slot whose
// keys alone load one primary beyond target (a hot key in the exact
// mode) fits on no number of primaries.
func Plan(f Fleet, target, bound float64, most int) (*Result, error) {
	if target <= 0 || target >= 1 || most < 1 {
		return nil, fmt.Errorf("target must be in (0, 1) and most >= 1")
	}
	f.Primaries = 1
	g := 1
	var r *Result
	var slots []slotLoad
	for range 50 {
		f.Gateways = g
		if bound > 0 {
			f.MaxSlice = bound / float64(g)
		}
		if err := f.check(); err != nil {
			return nil, err
		}
		r = &Result{Fleet: f, Offered: f.Rate}
		slots = r.Fleet.slots(r)
		need := int(math.Ceil(f.Rate * r.GatewayUs / 1e6 / (float64(f.Cores) * target)))
		if need <= g {
			break
		}
		g = need
	}
	hottest := 0
	for i, l := range slots {
		if l.cpu > slots[hottest].cpu {
			hottest = i
		}
	}
	if c := slots[hottest].cpu; c > target {
		r.Fleet.Primaries, r.Unfit = most, true
		r.place(slots)
		return r, fmt.Errorf("slot %d alone needs %.2f cores of Redis: no number of primaries holds it within %.0f%% of one", hottest, c, 100*target)
	}
	for p := 1; p <= most; p++ {
		r.Fleet.Primaries = p
		r.place(slots)
		if r.Primaries[r.Busiest].CPU <= target {
			return r, nil
		}
	}
	r.Unfit = true
	return r, fmt.Errorf("%d primaries leave the busiest %.0f%% busy, above %.0f%%", most, 100*r.Primaries[r.Busiest].CPU, 100*target)
}
