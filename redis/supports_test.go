package redis

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// A program checks its limits with Supports at start (sluice serve does,
// and at every reload); no request the Limiter charges on a limit that
// passed may then be refused by the store: the largest debt a request
// can ask for (engine.MaxDebt, what a max_reserved left unset means, and
// the most any may mean) keeps the script's numbers in its exact range.
// Take's own check is a guard for programs that skip Supports.
func TestSupportedLimitRefusesNoRequest(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	periods := []time.Duration{time.Microsecond * 7, time.Millisecond, time.Second, 3 * time.Second, time.Hour, 24 * time.Hour * 365}
	checked := 0
	for i := 0; i < 4000; i++ {
		spec := sluice.Spec{Name: "s", Rate: float64(int64(1) << rng.IntN(24)), Period: periods[rng.IntN(len(periods))], Capacity: float64(int64(1) << rng.IntN(34))}
		if rng.IntN(2) == 0 {
			spec.MaxReserved = float64(1 + rng.IntN(100)) // the limit's own bound is small: Supports checks little
		}
		switch rng.IntN(3) {
		case 1:
			spec.Algorithm = sluice.FixedWindow
		case 2:
			spec.Algorithm = sluice.LeakyBucket
		}
		lim, err := sluice.NewLimit(spec)
		if err != nil || Supports(lim) != nil {
			continue
		}
		checked++
		// A request may ask for a debt of its own, beyond the limit's
		// max_reserved (up to engine.MaxDebt).
		r := sluice.Request{Limit: lim, Key: "k", Reserve: true, Cost: lim.Capacity(), MaxReserved: 9e9}
		c, err := r.Charged(engine.OpTake)
		if err != nil {
			t.Fatalf("%+v: the largest reservation cannot be charged: %v", spec, err)
		}
		if err := fits(lim, max(lim.Params().MaxReserved, c.MaxReserved)); err != nil {
			t.Fatalf("%+v passed Supports, yet a request with the largest debt is refused at request time: %v", spec, err)
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d of the random limits passed Supports: the test checks too little", checked)
	}
}
