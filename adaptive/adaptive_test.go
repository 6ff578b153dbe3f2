package adaptive_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

var epoch = time.Unix(1_700_000_000, 0)

func testConfig() *adaptive.Config {
	// One key may move the rate: these tests are of the law; the share of
	// keys is TestAttackAdaptive*'s.
	c := adaptive.Config{Min: 10, Max: 100, Start: 50, TargetLatency: 200 * time.Millisecond, Increase: 10, Decrease: 0.5, MinKeys: 1}.WithDefaults()
	return &c
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// The law alone, on a clock passed in: the rate's path through healthy,
// unhealthy and idle intervals, one step per interval.
func TestNextPath(t *testing.T) {
	c := testConfig()
	st := c.Initial()
	now := epoch
	steps := []struct {
		h    adaptive.Health
		want float64
	}{
		{adaptive.Healthy, 60},   // +10
		{adaptive.Healthy, 70},   // +10
		{adaptive.Unhealthy, 35}, // x0.5
		{adaptive.Unhealthy, 17.5},
		{adaptive.Unhealthy, 10}, // floor: min
		{adaptive.Unhealthy, 10},
		{adaptive.Idle, 10}, // nothing measured: stays
		{adaptive.Healthy, 20},
		{adaptive.Healthy, 30},
	}
	for i, s := range steps {
		now = now.Add(c.Interval)
		st = adaptive.Next(c, st, s.h, now)
		if !near(st.Rate, s.want) {
			t.Fatalf("step %d (%v): rate %v, want %v", i, s.h, st.Rate, s.want)
		}
	}
	for range 20 {
		now = now.Add(c.Interval)
		st = adaptive.Next(c, st, adaptive.Healthy, now)
	}
	if st.Rate != c.Max {
		t.Fatalf("after a long healthy run: %v, want max %v", st.Rate, c.Max)
	}
}

// At most one step per interval: verdicts given more often (many
// processes, or many ticks) move the rate once, and an increase waits an
// interval after a decrease.
func TestNextOncePerInterval(t *testing.T) {
	c := testConfig()
	st := adaptive.Next(c, c.Initial(), adaptive.Unhealthy, epoch)
	if st.Rate != 25 {
		t.Fatalf("first decrease: %v", st.Rate)
	}
	half := epoch.Add(c.Interval / 2)
	if got := adaptive.Next(c, st, adaptive.Unhealthy, half); got != st {
		t.Fatalf("a second decrease within the interval: %+v", got)
	}
	if got := adaptive.Next(c, st, adaptive.Healthy, half); got != st {
		t.Fatalf("an increase within the interval after a decrease: %+v", got)
	}
	up := adaptive.Next(c, st, adaptive.Healthy, epoch.Add(c.Interval))
	if up.Rate != 35 {
		t.Fatalf("an interval later: %v, want 35", up.Rate)
	}
	// A decrease does not wait for the last increase: only for the last
	// decrease.
	down := adaptive.Next(c, up, adaptive.Unhealthy, epoch.Add(c.Interval+time.Millisecond))
	if down.Rate != 17.5 {
		t.Fatalf("decrease right after an increase: %v, want 17.5", down.Rate)
	}
	// A clock behind the stored stamps (another process's clock is
	// ahead) takes no step.
	if got := adaptive.Next(c, down, adaptive.Unhealthy, epoch); got != down {
		t.Fatalf("step with a clock behind the state's: %+v", got)
	}
}

// A reload that narrows the bounds brings the rate within them, and a
// state that is not a usable rate starts over at Start.
func TestNextClamps(t *testing.T) {
	c := testConfig()
	if got := adaptive.Next(c, adaptive.State{Rate: 500}, adaptive.Idle, epoch); got.Rate != 100 {
		t.Fatalf("rate above max: %v", got.Rate)
	}
	if got := adaptive.Next(c, adaptive.State{Rate: 1}, adaptive.Idle, epoch); got.Rate != 10 {
		t.Fatalf("rate below min: %v", got.Rate)
	}
	for _, bad := range []float64{0, -3, math.NaN(), math.Inf(1)} {
		if got := adaptive.Next(c, adaptive.State{Rate: bad}, adaptive.Idle, epoch); got.Rate != c.Start {
			t.Fatalf("rate %v: %v, want start %v", bad, got.Rate, c.Start)
		}
	}
}

func TestJudge(t *testing.T) {
	c := testConfig()
	c.ErrorRatio = 0.1
	for _, tc := range []struct {
		w    adaptive.Window
		want adaptive.Health
	}{
		{adaptive.Window{}, adaptive.Idle},
		{adaptive.Window{Responses: 10}, adaptive.Healthy},
		{adaptive.Window{Responses: 10, Errors: 1}, adaptive.Healthy},   // 10%: tolerated
		{adaptive.Window{Responses: 10, Errors: 2}, adaptive.Unhealthy}, // 20%
		{adaptive.Window{Responses: 10, Slow: 1}, adaptive.Healthy},     // p90 is the 9th of 10: in time
		{adaptive.Window{Responses: 10, Slow: 2}, adaptive.Unhealthy},   // the 9th is slow
		{adaptive.Window{Responses: 1, Slow: 1}, adaptive.Unhealthy},
	} {
		if got := c.Judge(tc.w); got != tc.want {
			t.Errorf("Judge(%+v) = %v, want %v", tc.w, got, tc.want)
		}
	}
	c.ErrorRatio = 0
	if got := c.Judge(adaptive.Window{Responses: 1000, Errors: 1}); got != adaptive.Unhealthy {
		t.Errorf("error_ratio 0, one error in 1000: %v", got)
	}
	c.TargetLatency = 0
	if got := c.Judge(adaptive.Window{Responses: 1, Slow: 1}); got != adaptive.Healthy {
		t.Errorf("no target latency: judged by latency: %v", got)
	}
}

// JudgeKeys lowers the rate only when at least MinKeys and MinKeyShare of
// an interval's keys are unhealthy: one key cannot, and the same bar holds
// the other way, as many healthy keys keeping the share under it
// (docs/security.md).
func TestJudgeKeys(t *testing.T) {
	c := adaptive.Config{Min: 10, Max: 100}.WithDefaults() // MinKeys 2, MinKeyShare 0.5
	for _, tc := range []struct {
		t    adaptive.Tally
		want adaptive.Health
	}{
		{adaptive.Tally{}, adaptive.Idle},
		{adaptive.Tally{Keys: 1, Unhealthy: 1}, adaptive.Idle},      // one key: not enough
		{adaptive.Tally{Keys: 3, Unhealthy: 1}, adaptive.Healthy},   // one key among others
		{adaptive.Tally{Keys: 3, Unhealthy: 2}, adaptive.Unhealthy}, // two, and two thirds
		{adaptive.Tally{Keys: 4, Unhealthy: 2}, adaptive.Unhealthy}, // half
		{adaptive.Tally{Keys: 5, Unhealthy: 2}, adaptive.Healthy},   // diluted by healthy keys
		{adaptive.Tally{Keys: 100, Unhealthy: 49}, adaptive.Healthy},
	} {
		if got := c.JudgeKeys(tc.t); got != tc.want {
			t.Errorf("JudgeKeys(%+v) = %v, want %v", tc.t, got, tc.want)
		}
	}
}

// Judge counts the slow responses and keeps no latency: its verdict is
// that of the nearest-rank percentile of the latencies themselves.
func TestJudgeIsNearestRankPercentile(t *testing.T) {
	nearestRank := func(samples []time.Duration, p float64) time.Duration {
		slices.Sort(samples)
		rank := int(math.Ceil(p / 100 * float64(len(samples))))
		return samples[min(max(rank, 1), len(samples))-1]
	}
	c := testConfig()
	for _, p := range []float64{1, 50, 90, 99, 100} {
		c.Percentile = p
		for n := 1; n <= 20; n++ {
			for slow := 0; slow <= n; slow++ {
				lat := make([]time.Duration, n)
				for i := range lat {
					lat[i] = c.TargetLatency / 2
					if i < slow {
						lat[i] = 2 * c.TargetLatency
					}
				}
				want := adaptive.Healthy
				if nearestRank(lat, p) > c.TargetLatency {
					want = adaptive.Unhealthy
				}
				if got := c.Judge(adaptive.Window{Responses: n, Slow: slow}); got != want {
					t.Errorf("p%v, %d of %d slow: %v, want %v", p, slow, n, got, want)
				}
			}
		}
	}
}

func TestScale(t *testing.T) {
	c := testConfig()
	if s := c.Scale(50); s != 1 {
		t.Errorf("at start: %v", s)
	}
	if s := c.Scale(10); s != 5 {
		t.Errorf("at min: %v", s)
	}
	if s := c.Scale(100); s != 0.5 {
		t.Errorf("at max: %v", s)
	}
	if s := c.Scale(0); s != 1 {
		t.Errorf("no rate: %v", s)
	}
}

func TestValidate(t *testing.T) {
	good := *testConfig()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*adaptive.Config){
		"min":         func(c *adaptive.Config) { c.Min = 0 },
		"max":         func(c *adaptive.Config) { c.Max = c.Min },
		"start":       func(c *adaptive.Config) { c.Start = 200 },
		"percentile":  func(c *adaptive.Config) { c.Percentile = 101 },
		"error_ratio": func(c *adaptive.Config) { c.ErrorRatio = 1 },
		"interval":    func(c *adaptive.Config) { c.Interval = time.Millisecond },
		"decrease":    func(c *adaptive.Config) { c.Decrease = 1 },
		"increase":    func(c *adaptive.Config) { c.Increase = math.Inf(1) },
		"status":      func(c *adaptive.Config) { c.ErrorStatuses = []int{600} },
	} {
		c := good
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: no error for %+v", name, c)
		}
	}
}

func TestStateEncoding(t *testing.T) {
	st := adaptive.State{Rate: 12.5, Changed: 1700000000000000, Decreased: 1699999999000000}
	got, err := adaptive.ParseState(st.String())
	if err != nil || got != st {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for _, bad := range []string{"", "1 2", "x 1 2", "0 1 2", "-1 1 2", "NaN 1 2", "+Inf 1 2", "1 x 2", "1 2 3 4"} {
		if _, err := adaptive.ParseState(bad); err == nil {
			t.Errorf("ParseState(%q): no error", bad)
		}
	}
}

// A controller on its own clock: the responses of each interval move the
// rate once the interval is over, and not before.
func TestControllerLocal(t *testing.T) {
	c := testConfig()
	now := epoch
	ctl := adaptive.NewController("api", c, nil, now)
	var seen []float64
	ctl.OnChange = func(r float64) { seen = append(seen, r) }
	ctx := context.Background()

	for range 5 {
		ctl.Observe("k", 200, 10*time.Millisecond)
	}
	if err := ctl.Tick(ctx, now.Add(c.Interval/2)); err != nil || ctl.Rate() != 50 {
		t.Fatalf("before the interval ends: %v, %v", ctl.Rate(), err)
	}
	now = now.Add(c.Interval)
	ctl.Tick(ctx, now)
	if ctl.Rate() != 60 {
		t.Fatalf("healthy interval: %v, want 60", ctl.Rate())
	}
	ctl.Observe("k", 503, time.Millisecond)
	ctl.Observe("k", 0, time.Hour) // a client that went away: not counted
	now = now.Add(c.Interval)
	ctl.Tick(ctx, now)
	if ctl.Rate() != 30 {
		t.Fatalf("interval with errors: %v, want 30", ctl.Rate())
	}
	ctl.Observe("k", 200, 300*time.Millisecond) // above the 200ms target
	now = now.Add(c.Interval)
	ctl.Tick(ctx, now)
	if ctl.Rate() != 15 {
		t.Fatalf("slow interval: %v, want 15", ctl.Rate())
	}
	now = now.Add(c.Interval)
	ctl.Tick(ctx, now) // idle
	if ctl.Rate() != 15 {
		t.Fatalf("idle interval: %v", ctl.Rate())
	}
	if want := []float64{60, 30, 15}; len(seen) != len(want) || seen[0] != 60 || seen[1] != 30 || seen[2] != 15 {
		t.Fatalf("OnChange saw %v, want %v", seen, want)
	}

	narrow := *c
	narrow.Min, narrow.Max = 20, 40
	ctl.SetConfig(&narrow)
	if ctl.Rate() != 20 {
		t.Fatalf("after a reload to [20,40]: %v", ctl.Rate())
	}
}

// Many latencies in one interval: the percentile is estimated from a
// bounded sample, and still tells a slow upstream from a fast one.
func TestControllerManySamples(t *testing.T) {
	c := testConfig()
	ctl := adaptive.NewController("api", c, nil, epoch)
	for i := range 100_000 {
		d := 10 * time.Millisecond
		if i%2 == 0 {
			d = time.Second // half are slow: the 90th percentile is slow
		}
		ctl.Observe("k", 200, d)
	}
	ctl.Tick(context.Background(), epoch.Add(c.Interval))
	if ctl.Rate() != 25 {
		t.Fatalf("rate %v, want 25 (slow interval)", ctl.Rate())
	}
}

// values is a store of shared values in this process, standing in for the
// redis store (whose own implementation is tested against a real Redis
// in package httpgate).
type values struct {
	mu   sync.Mutex
	m    map[string]string
	fail error
	// race, when set, is run inside the next compare-and-swap, before it
	// compares: another process stepping first.
	race func(m map[string]string)
}

func (v *values) LoadValue(_ context.Context, key string) (string, bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.fail != nil {
		return "", false, v.fail
	}
	s, ok := v.m[key]
	return s, ok, nil
}

func (v *values) CompareAndSwapValue(_ context.Context, key, old, value string, _ time.Duration) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.fail != nil {
		return false, v.fail
	}
	if v.race != nil {
		v.race(v.m)
		v.race = nil
	}
	if v.m[key] != old {
		return false, nil
	}
	v.m[key] = value
	return true, nil
}

// Two processes share one state: each reports its interval's counts by
// key to the fleet's tally, a key seen by both is one key, and the
// interval is judged on the whole tally an interval later, once, whoever
// ticks.
func TestControllerShared(t *testing.T) {
	c := testConfig()
	c.MinKeys = 2
	store := &values{m: map[string]string{}}
	ctx := context.Background()
	a := adaptive.NewController("api", c, store, epoch)
	b := adaptive.NewController("api", c, store, epoch)
	if err := a.Sync(ctx, epoch); err != nil {
		t.Fatal(err)
	}
	rate := func() float64 {
		t.Helper()
		st, err := adaptive.ParseState(strings.Join(strings.Fields(store.m["adaptive:api"])[:3], " "))
		if err != nil {
			t.Fatal(err)
		}
		return st.Rate
	}
	tick := func(ctl *adaptive.Controller, at time.Time) {
		t.Helper()
		if err := ctl.Tick(ctx, at); err != nil {
			t.Fatal(err)
		}
	}
	// One key failing on both processes is one unhealthy key: the rate
	// stays.
	a.Observe("x", 500, time.Millisecond)
	b.Observe("x", 500, time.Millisecond)
	now := epoch.Add(c.Interval)
	tick(a, now)
	tick(b, now.Add(time.Millisecond))
	if r := rate(); r != 50 {
		t.Fatalf("before the interval is judged: %v", r)
	}
	// Two keys of three failing, one on each process: the tally, judged
	// by the first report of the next interval, halves the rate.
	now = now.Add(c.Interval)
	a.Observe("x", 500, time.Millisecond)
	a.Observe("z", 200, time.Millisecond)
	b.Observe("y", 500, time.Millisecond)
	tick(a, now) // judges the first interval: one unhealthy key, idle
	tick(b, now.Add(time.Millisecond))
	if r := rate(); r != 50 || a.Rate() != 50 {
		t.Fatalf("one unhealthy key moved the rate: %v", r)
	}
	now = now.Add(c.Interval)
	tick(b, now)
	if b.Rate() != 25 || rate() != 25 {
		t.Fatalf("two unhealthy keys of three: %v (shared %v), want 25", b.Rate(), rate())
	}
	tick(a, now.Add(time.Millisecond))
	if a.Rate() != 25 {
		t.Fatalf("a adopted %v, want the fleet's 25 (one decrease per interval)", a.Rate())
	}

	// A step that loses its compare-and-swap to another process reads
	// the winner's state and reports to it.
	store.race = func(m map[string]string) {
		m["adaptive:api"] = adaptive.State{Rate: 80, Changed: 1, Decreased: 1}.String()
	}
	a.Observe("x", 500, time.Millisecond)
	a.Observe("y", 500, time.Millisecond)
	now = now.Add(2 * c.Interval)
	tick(a, now)
	if a.Rate() != 80 {
		t.Fatalf("after a lost swap: %v, want the winner's 80", a.Rate())
	}
	now = now.Add(c.Interval)
	tick(b, now)
	if b.Rate() != 40 {
		t.Fatalf("a's report survived the lost swap: %v, want 40 (80 halved)", b.Rate())
	}

	// A store that fails: the step is taken on the process's own state
	// and counts.
	store.fail = errors.New("down")
	a.Observe("x", 500, time.Millisecond)
	a.Observe("y", 500, time.Millisecond)
	now = now.Add(c.Interval)
	if err := a.Tick(ctx, now); err == nil {
		t.Fatal("no error from a failing store")
	}
	if a.Rate() != 40 {
		t.Fatalf("local step: %v, want 40 (a's own 80, halved)", a.Rate())
	}

	// A value in the store that is not a state is written over.
	store.fail = nil
	store.m["adaptive:api"] = "garbage"
	if err := a.Sync(ctx, now); err != nil {
		t.Fatal(err)
	}
	if r := rate(); r != 40 {
		t.Fatalf("garbage replaced by %q", store.m["adaptive:api"])
	}
}

// A Registry makes a limit's controller once and keeps it by name, under
// the config of the latest request, telling OnRate its rate when made and
// at each change.
func TestRegistry(t *testing.T) {
	var rg adaptive.Registry
	var told []float64
	rg.OnRate = func(name string, rate float64, c *adaptive.Config) {
		if name != "api" || c.Min == 0 {
			t.Errorf("OnRate(%q, %v, %+v)", name, rate, c)
		}
		told = append(told, rate)
	}
	ctx, c, now := context.Background(), testConfig(), epoch
	if rg.Get("api") != nil {
		t.Fatal("a controller before the limit's first use")
	}
	ctl := rg.Controller(ctx, "api", c, now)
	ctl.Observe("k", 200, time.Millisecond)
	now = now.Add(c.Interval)
	if again := rg.Controller(ctx, "api", c, now); again != ctl || rg.Get("api") != ctl {
		t.Fatal("a second controller for the same limit")
	}
	if ctl.Rate() != 60 || len(told) != 2 || told[0] != 50 || told[1] != 60 {
		t.Fatalf("rate %v, OnRate told %v; want 60 after the step due, told [50 60]", ctl.Rate(), told)
	}
	narrow := *c
	narrow.Min, narrow.Max = 70, 80
	if rg.Controller(ctx, "api", &narrow, now).Rate() != 70 {
		t.Fatalf("a reload's bounds do not apply: %v", ctl.Rate())
	}
}

// A tally written by an earlier version, "END" without "/SEEN", is read
// as a sample of the keys it holds, so that a fleet being upgraded keeps
// both versions' reports of an interval.
func TestSharedTallyOfEarlierVersion(t *testing.T) {
	c := testConfig()
	c.MinKeys = 2
	store := &values{m: map[string]string{}}
	ctx := context.Background()
	a := adaptive.NewController("api", c, store, epoch)
	b := adaptive.NewController("api", c, store, epoch)
	a.Observe("x", 500, time.Millisecond)
	b.Observe("y", 500, time.Millisecond)
	now := epoch.Add(c.Interval)
	if err := a.Tick(ctx, now); err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(store.m["adaptive:api"])
	end, _, ok := strings.Cut(f[3], "/")
	if !ok {
		t.Fatalf("no tally size in %q", store.m["adaptive:api"])
	}
	f[3] = end
	store.m["adaptive:api"] = strings.Join(f, " ")
	for _, at := range []time.Time{now.Add(time.Millisecond), now.Add(c.Interval)} {
		if err := b.Tick(ctx, at); err != nil {
			t.Fatal(err)
		}
	}
	if b.Rate() != 25 {
		t.Fatalf("two unhealthy keys, one in an earlier version's tally: rate %v, want 25", b.Rate())
	}
}

// Attack: lower a fleet's rate from one process by filling the fleet's
// tally there first. The attacker's keys are a quarter of the fleet's,
// all on process a, which reports first; the interval must be judged on
// a sample of every process's keys, not on the first report's alone.
func TestAttackAdaptiveFleetTallyFilledFirst(t *testing.T) {
	c := testConfig()
	c.MinKeys = adaptive.DefaultMinKeys
	store := &values{m: map[string]string{}}
	ctx := context.Background()
	a := adaptive.NewController("api", c, store, epoch)
	b := adaptive.NewController("api", c, store, epoch)
	now := epoch.Add(c.Interval)
	for i := range adaptive.MaxKeys {
		a.Observe(fmt.Sprintf("attacker-%d", i), 500, time.Millisecond)
	}
	for i := range 3 * adaptive.MaxKeys {
		b.Observe(fmt.Sprintf("client-%d", i), 200, time.Millisecond)
	}
	for _, ctl := range []*adaptive.Controller{a, b} {
		if err := ctl.Tick(ctx, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Tick(ctx, now.Add(c.Interval)); err != nil {
		t.Fatal(err)
	}
	if b.Rate() < c.Start {
		t.Fatalf("the rate fell to %v on %d failing keys of %d", b.Rate(), adaptive.MaxKeys, 4*adaptive.MaxKeys)
	}
}
