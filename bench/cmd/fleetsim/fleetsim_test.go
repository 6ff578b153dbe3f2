package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/svgplot"
)

func fleet(mode string) Fleet {
	return Fleet{
		Rate: 1e6, Door: "grpc", Gateways: 4, Cores: 16, Primaries: 8, Keys: 1000, Zipf: 1.1,
		HotShare: 0.3, Headroom: 1.25, Mode: mode, Shards: 16, MaxSlice: 0.0025, Term: 1, HotAfter: 8,
		Costs: measured,
	}
}

func mustModel(t *testing.T, f Fleet) *Result {
	t.Helper()
	r, err := Model(f)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Every measured cost is there and positive: a zero would make a part of
// the fleet free.
func TestCostsMeasured(t *testing.T) {
	c := measured
	for _, d := range []string{"auth", "take", "grpc"} {
		if c.Door[d] <= 0 {
			t.Errorf("door %s: %v", d, c.Door[d])
		}
	}
	for name, v := range map[string]float64{"ClientExact": c.ClientExact, "ClientLocal": c.ClientLocal, "RedisExact": c.RedisExact,
		"RedisHotExact": c.RedisHotExact, "RedisSharded": c.RedisSharded, "RedisLease": c.RedisLease, "LeaseOpsPerSlice": c.LeaseOpsPerSlice} {
		if !(v > 0) {
			t.Errorf("%s: %v", name, v)
		}
	}
}

// The exact and sharded modes never admit beyond the limit; the leased
// mode's worst overshoot is within gateways x max_slice of the key's
// capacity, whatever the fleet's shape.
func TestOvershootWithinBound(t *testing.T) {
	for _, g := range []int{1, 3, 10, 100} {
		for _, share := range []float64{0, 0.5, 1} {
			for _, slice := range []float64{0.0001, 0.003, 0.1} {
				for _, mode := range []string{Exact, Leased, Sharded} {
					f := fleet(mode)
					f.Gateways, f.HotShare, f.MaxSlice = g, share, slice
					r := mustModel(t, f)
					if mode != Leased && (r.Overshoot != 0 || r.LeasedKeys != 0) {
						t.Errorf("%s: overshoot %v, %d keys leased", mode, r.Overshoot, r.LeasedKeys)
					}
					if bound := float64(g) * slice; r.Overshoot > bound*(1+1e-12) {
						t.Errorf("%d gateways, max_slice %v: overshoot %v beyond %v", g, slice, r.Overshoot, bound)
					}
				}
			}
		}
	}
}

// The store's work is the keys', however the slots are laid on the
// primaries.
func TestStoreWorkIndependentOfPrimaries(t *testing.T) {
	for _, mode := range []string{Exact, Leased, Sharded} {
		var want float64
		for i, p := range []int{1, 2, 3, 7, 64, 1000} {
			f := fleet(mode)
			f.Primaries = p
			r := mustModel(t, f)
			sum := 0.0
			for _, pr := range r.Primaries {
				sum += pr.CPU
			}
			if i == 0 {
				want = sum
			} else if math.Abs(sum-want) > 1e-9*want {
				t.Errorf("%s on %d primaries: %v cores in all, %v on one", mode, p, sum, want)
			}
		}
	}
}

// An exact fleet sends every decision to the store; a leased one fewer,
// and no more store CPU in all.
func TestLeasingOnlySavesStoreWork(t *testing.T) {
	ex, le := mustModel(t, fleet(Exact)), mustModel(t, fleet(Leased))
	if math.Abs(ex.ToStore-1) > 1e-9 || math.Abs(ex.StoreOps-ex.Rate) > 1e-9*ex.Rate {
		t.Errorf("exact: %v of decisions to the store, %v calls for %v decisions", ex.ToStore, ex.StoreOps, ex.Rate)
	}
	if le.ToStore >= 1 || le.LeasedKeys == 0 {
		t.Errorf("leased: %v of decisions to the store, %d keys leased", le.ToStore, le.LeasedKeys)
	}
	cpu := func(r *Result) (s float64) {
		for _, p := range r.Primaries {
			s += p.CPU
		}
		return s
	}
	if cpu(le) > cpu(ex) {
		t.Errorf("leased: %v cores of Redis, exact %v", cpu(le), cpu(ex))
	}
}

// More gateways never serve less, and a saturated stage serves no more
// than it can.
func TestServedBounded(t *testing.T) {
	for _, mode := range []string{Exact, Leased, Sharded} {
		prev := 0.0
		for g := 1; g <= 64; g *= 2 {
			f := fleet(mode)
			f.Gateways, f.MaxSlice = g, 0.01/float64(g)
			r := mustModel(t, f)
			if r.Served > r.Offered*(1+1e-12) || r.Served < prev*(1-1e-9) && mode == Exact {
				t.Errorf("%s, %d gateways: served %v (offered %v, %v with fewer)", mode, g, r.Served, r.Offered, prev)
			}
			if r.GatewayCPU > 1 && r.Served > r.Offered/r.GatewayCPU*(1+1e-12) {
				t.Errorf("%s, %d gateways at %v of their cores: served %v", mode, g, r.GatewayCPU, r.Served)
			}
			prev = r.Served
		}
	}
}

// The gateway's p99 grows with its load, is at least one service time,
// and on one core is M/M/1's: service plus ln(100 rho)/(mu - lambda).
func TestGatewayP99(t *testing.T) {
	prev := 0.0
	for _, load := range []float64{0.1, 0.5, 0.9, 0.99} {
		p := mmcP99(load*16/10e-6, 10, 16)
		if p < 10 || p < prev {
			t.Errorf("load %v: p99 %v µs (%v at less load)", load, p, prev)
		}
		prev = p
	}
	mu, lambda := 1e5, 0.9e5
	want := 10 + math.Log(100*0.9)/(mu-lambda)*1e6
	if got := mmcP99(lambda, 10, 1); math.Abs(got-want) > 1e-6 {
		t.Errorf("M/M/1 at 0.9: %v µs, want %v", got, want)
	}
	if !math.IsInf(mmcP99(2e5, 10, 1), 1) {
		t.Error("a saturated gateway has a finite p99")
	}
}

// The fleet of the docs: ten million decisions a second on a plan whose
// every core is at most 70% busy and whose leased overshoot is within
// 1% of the hot key's capacity; exact mode fits on no number of
// primaries, its hot key's slot alone saturating one.
func TestTenMillion(t *testing.T) {
	f := fleet(Leased)
	f.Rate, f.HotShare, f.Keys = 10e6, 0.5, 100000
	r, err := Plan(f, 0.7, 0.01, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if r.Served < 10e6*(1-1e-9) || r.GatewayCPU > 0.7 || r.Primaries[r.Busiest].CPU > 0.7 || r.Overshoot > 0.01*(1+1e-12) {
		t.Errorf("served %v on %d gateways at %v, %d primaries, the busiest at %v, overshoot %v",
			r.Served, r.Gateways, r.GatewayCPU, r.Fleet.Primaries, r.Primaries[r.Busiest].CPU, r.Overshoot)
	}
	f.Mode = Exact
	if r, err := Plan(f, 0.7, 0.01, 1024); err == nil || !r.Unfit || r.Served >= 10e6 {
		t.Errorf("exact: %v, unfit %v, served %v", err, r.Unfit, r.Served)
	}
}

// The chart carries, per primary and mode, the CPU the model computes.
func TestChartCarriesFigures(t *testing.T) {
	var rows []*Result
	for _, m := range []string{Exact, Leased, Sharded} {
		rows = append(rows, mustModel(t, fleet(m)))
	}
	c, err := fleetChart(rows)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := c.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	pic, err := svgplot.Read(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		s := pic.Panels[0].Series["cpu_"+r.Mode]
		if s == nil || len(s.Value) != len(r.Primaries) {
			t.Fatalf("%s: %+v", r.Mode, s)
		}
		for i, v := range s.Value {
			if w := r.Primaries[s.Index[i]].CPU; v != w || math.Abs(s.Drawn[i]-w) > s.Resolution[i]+1e-9 {
				t.Errorf("%s primary %d: carries %v, draws %v, the model says %v", r.Mode, s.Index[i], v, s.Drawn[i], w)
			}
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-mode", "fast"}, {"-gateways", "3"}, {"-bound", "200%"}, {"-max-slice", "x"}, {"-door", "smtp"}, {"extra"},
	} {
		if err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

const scalingDoc = "../../../docs/scaling.md"

// docs/scaling.md's figures are what its commands print: each table
// follows the command that prints it, and the chart is what its command
// draws.
func TestScalingDocFigures(t *testing.T) {
	b, err := os.ReadFile(scalingDoc)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	const prefix = "    cd bench && go run ./cmd/fleetsim"
	checked := 0
	for i, line := range lines {
		args, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		fields := strings.Fields(args)
		var svg, tmp string
		for k, f := range fields {
			if f == "-svg" && k+1 < len(fields) {
				svg, tmp = fields[k+1], filepath.Join(t.TempDir(), "chart.svg")
				fields[k+1] = tmp
			}
		}
		var out bytes.Buffer
		if err := run(fields, &out); err != nil {
			t.Fatalf("docs/scaling.md:%d: %v", i+1, err)
		}
		if svg != "" {
			drawn, _ := os.ReadFile(tmp)
			committed, err := os.ReadFile(filepath.Join("../..", svg))
			if err != nil || !bytes.Equal(drawn, committed) {
				t.Errorf("docs/scaling.md:%d: %s is not what the command draws now (%v)", i+1, svg, err)
			}
		}
		var want []string
		for l := range strings.SplitSeq(out.String(), "\n") {
			if strings.HasPrefix(l, "|") {
				want = append(want, l)
			}
		}
		var got []string
		for _, l := range lines[i+1:] {
			if strings.HasPrefix(l, "|") {
				got = append(got, l)
			} else if len(got) > 0 || strings.HasPrefix(l, prefix) {
				break
			}
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("docs/scaling.md:%d: the table after the command is\n%s\nthe command prints\n%s", i+1, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		checked++
	}
	if checked < 3 {
		t.Errorf("docs/scaling.md shows %d fleetsim commands with their tables", checked)
	}
}

// -primaries-table prints one row per primary of each mode.
func TestPrimariesTable(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"-rate", "100000", "-keys", "100", "-gateways", "2", "-primaries", "3", "-mode", "exact,leased", "-primaries-table"}, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, m := range []string{"exact", "leased"} {
		_, after, ok := strings.Cut(s, "\n"+m+": each primary\n")
		if !ok {
			t.Fatalf("no table of %s's primaries in\n%s", m, s)
		}
		rows := 0
		for l := range strings.SplitSeq(after, "\n") {
			if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| primary") {
				rows++
			} else if rows > 0 && !strings.HasPrefix(l, "|") {
				break
			}
		}
		if rows != 3 {
			t.Errorf("%s: %d primaries listed, want 3", m, rows)
		}
	}
}
