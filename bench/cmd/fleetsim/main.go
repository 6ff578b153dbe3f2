// Command fleetsim puts a fleet of sluice gateways and Redis primaries on
// paper: from the measured cost of a decision at each part (costs.go,
// each figure naming its benchmark) and the fleet's shape and traffic, it
// reports the decisions a second the fleet serves, each primary's load,
// the decisions' tail latency (a queueing model, Model's comment) and the
// worst overshoot against the exact limit, for limits kept exact, leased
// or sharded.
//
// Without -gateways and -primaries it plans: for each mode, the fewest
// gateways and primaries that serve -rate with every core at most
// -target busy. -svg draws the planned leased fleet's primaries in the
// three modes and what each serves as primaries are added.
//
//	cd bench && go run ./cmd/fleetsim -rate 10000000 -svg /tmp/fleet.svg
//
// Nothing is measured here: it is arithmetic on the measured figures.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(2)
	}
}

// options are the command's flags.
type options struct {
	fleet    Fleet
	modes    []string
	target   float64
	bound    float64
	most     int
	svg      string
	detail   bool
	maxSlice string
}

func parse(args []string, w io.Writer) (*options, error) {
	fs := flag.NewFlagSet("fleetsim", flag.ContinueOnError)
	fs.SetOutput(w)
	o := &options{fleet: Fleet{Costs: measured}}
	f := &o.fleet
	fs.Float64Var(&f.Rate, "rate", 10e6, "decisions a second offered to the fleet")
	fs.StringVar(&f.Door, "door", "grpc", "the front door: grpc (Envoy's rate limit service), auth (forward auth) or take (the decision API)")
	fs.IntVar(&f.Gateways, "gateways", 0, "sluice gateways (0: plan)")
	fs.IntVar(&f.Cores, "cores", 16, "cores per gateway")
	fs.IntVar(&f.Primaries, "primaries", 0, "Redis primaries (0: plan)")
	fs.IntVar(&f.Keys, "keys", 100000, "keys beside the hot one, with Zipf weights")
	fs.Float64Var(&f.Zipf, "zipf", 1.1, "the keys' Zipf exponent")
	fs.Float64Var(&f.HotShare, "hot", 0.5, "the share of decisions on the one global key")
	fs.Float64Var(&f.Headroom, "headroom", 1.25, "each key's limit over its traffic")
	fs.IntVar(&f.Shards, "shards", 64, "the hot key's shards in the sharded mode")
	fs.StringVar(&o.maxSlice, "max-slice", "", "lease.max_slice, a share of the capacity such as 0.3% (default: -bound over the gateways)")
	term := fs.Duration("term", time.Second, "lease.term")
	fs.Float64Var(&f.HotAfter, "hot-after", defaultHotAfter, "lease.hot_after")
	mode := fs.String("mode", "exact,leased,sharded", "the modes, comma-separated")
	bound := fs.String("bound", "1%", "the leased overshoot to plan for, a share of the hot key's capacity")
	fs.Float64Var(&o.target, "target", 0.7, "the busiest core's share a plan allows")
	fs.IntVar(&o.most, "max-primaries", 1024, "the most primaries a plan tries")
	fs.StringVar(&o.svg, "svg", "", "draw the leased fleet's primaries and scaling to this file")
	fs.BoolVar(&o.detail, "primaries-table", false, "print each primary's load")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	f.Term = term.Seconds()
	var err error
	if o.bound, err = share(*bound); err != nil {
		return nil, fmt.Errorf("-bound: %w", err)
	}
	if o.maxSlice != "" {
		if f.MaxSlice, err = share(o.maxSlice); err != nil {
			return nil, fmt.Errorf("-max-slice: %w", err)
		}
		o.bound = 0
	}
	for m := range strings.SplitSeq(*mode, ",") {
		if m != Exact && m != Leased && m != Sharded {
			return nil, fmt.Errorf("-mode: %q is not exact, leased or sharded", m)
		}
		o.modes = append(o.modes, m)
	}
	if (f.Gateways == 0) != (f.Primaries == 0) {
		return nil, errors.New("give both -gateways and -primaries, or neither (to plan)")
	}
	return o, nil
}

// share reads "0.3%" or "0.003".
func share(s string) (float64, error) {
	div := 1.0
	if t, ok := strings.CutSuffix(s, "%"); ok {
		s, div = t, 100
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v/div > 1 {
		return 0, fmt.Errorf("%q: want a share such as 0.3%% or 0.003", s)
	}
	return v / div, nil
}

func run(args []string, w io.Writer) error {
	o, err := parse(args, w)
	if err != nil {
		return err
	}
	f := o.fleet
	fmt.Fprintf(w, "%s decisions/s offered at the %s door; %d cores a gateway; %d keys (Zipf %v) beside one global key that takes %v%% of them; limits %vx their traffic\n\n",
		group(f.Rate), f.Door, f.Cores, f.Keys, f.Zipf, 100*f.HotShare, f.Headroom)
	var rows []*Result
	var notes []string
	for _, m := range o.modes {
		g := f
		g.Mode = m
		var r *Result
		if f.Gateways == 0 {
			r, err = Plan(g, o.target, o.bound, o.most)
			if r == nil {
				return err
			}
			if err != nil {
				notes = append(notes, fmt.Sprintf("%s: %v", m, err))
			}
		} else {
			if o.bound > 0 {
				g.MaxSlice = o.bound / float64(g.Gateways)
			}
			if r, err = Model(g); err != nil {
				return err
			}
		}
		rows = append(rows, r)
	}
	table(w, rows, o.most)
	for _, n := range notes {
		fmt.Fprintln(w, "\n"+n)
	}
	if o.detail {
		for _, r := range rows {
			primaries(w, r)
		}
	}
	if o.svg == "" {
		return nil
	}
	c, err := fleetChart(rows)
	if err != nil {
		return err
	}
	out, err := os.Create(o.svg)
	if err != nil {
		return err
	}
	if err := c.WriteSVG(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func table(w io.Writer, rows []*Result, most int) {
	fmt.Fprintln(w, "| mode | gateways | primaries | served/s | gateway CPU | busiest primary CPU | store calls/s | decisions to the store | p99 µs (no network) | leased keys | worst overshoot (bound) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range rows {
		over := "0"
		if r.Mode == Leased {
			over = fmt.Sprintf("%s%% = %s tokens (%s%%, max_slice %s%%)", pct(r.Overshoot), group(r.OvershootTokens), pct(r.Bound), pct(r.MaxSlice))
		}
		prim := strconv.Itoa(r.Fleet.Primaries)
		if r.Unfit {
			prim = fmt.Sprintf("none fits (%d tried)", most)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %.0f%% | %.0f%% | %s | %s%% | %s | %d | %s |\n",
			r.Mode, r.Gateways, prim, group(r.Served), 100*r.GatewayCPU, 100*r.Primaries[r.Busiest].CPU,
			group(r.StoreOps), pct(r.ToStore), micros(r.P99), r.LeasedKeys, over)
	}
}

func primaries(w io.Writer, r *Result) {
	fmt.Fprintf(w, "\n%s: each primary\n\n| primary | CPU | calls/s | decisions waiting/s | mean wait µs |\n|---:|---:|---:|---:|---:|\n", r.Mode)
	for i, p := range r.Primaries {
		fmt.Fprintf(w, "| %d | %.1f%% | %s | %s | %s |\n", i, 100*p.CPU, group(p.OpsPerS), group(p.Decisions), micros(p.Sojourn))
	}
}

// group writes v rounded to a whole number with thousands separated.
func group(v float64) string {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return "-"
	}
	s := strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// pct writes a share as a percentage with up to 3 significant digits.
func pct(v float64) string {
	v *= 100
	if v == 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	scale := math.Pow(10, 2-math.Floor(math.Log10(math.Abs(v))))
	return strconv.FormatFloat(math.Round(v*scale)/scale, 'f', -1, 64)
}

func micros(v float64) string {
	if math.IsInf(v, 0) {
		return "saturated"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}
