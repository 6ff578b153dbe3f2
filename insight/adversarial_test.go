package insight

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
)

// Attack: a flood of fresh keys (one per request, as a client minting
// addresses or user ids does) to grow the statistics without bound. The
// rankings keep Counters counters each, however many keys arrive, and the
// flooder's keys do not push out a key seen more than N/k times.
func TestAttackKeyFloodBounded(t *testing.T) {
	clk := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	c := New(Options{Clock: clk, Counters: 32})
	one := make([]policy.Result, 1)
	for i := range 200_000 {
		if i%10 == 0 {
			one[0] = result(ruleLg, "real-attacker", true)
		} else {
			one[0] = result(ruleIP, "flood-"+strconv.Itoa(i), true)
		}
		c.ObserveResults(one)
		if i%50_000 == 0 {
			clk.Advance(30 * time.Second) // across ranking periods
		}
	}
	for i := range c.shards {
		for _, r := range [][2]*spaceSaving{c.shards[i].traffic, c.shards[i].rejected} {
			for _, s := range r {
				if s.n > 32 || len(s.slots) > 32 || len(s.bcount) > 32 || len(s.table) > 64 {
					t.Errorf("a ranking holds %d counters in %d, %d buckets, a table of %d; want at most 32 and 64", s.n, len(s.slots), len(s.bcount), len(s.table))
				}
			}
		}
	}
	if n := len(*c.rules.Load()); n != 2 {
		t.Errorf("%d rule series for 2 rules", n)
	}
	top := c.Snapshot(1).ByRejected
	if len(top.Keys) != 1 || top.Keys[0].Key != "real-attacker" {
		t.Errorf("the flood hid the real attacker: %+v", top)
	}
}
