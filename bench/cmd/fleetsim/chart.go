package main

import (
	"fmt"
	"math"
	"strconv"

	"github.com/sluicehq/sluice/internal/svgplot"
)

// Colours of the modes, the same in every panel.
var modeColor = map[string]string{Exact: "#c62828", Leased: "#2e7d32", Sharded: "#1565c0"}

// fleetChart draws the fleets of rows: above, each primary's CPU in
// every mode, on the primaries of the leased row (or the first); below,
// the decisions a second each mode serves on its row's gateways as
// primaries are added. The elements carry the exact figures (svgplot's
// data-* attributes).
func fleetChart(rows []*Result) (*svgplot.Chart, error) {
	at := rows[0]
	for _, r := range rows {
		if r.Mode == Leased {
			at = r
		}
	}
	n := at.Fleet.Primaries
	names := make([]string, n)
	for i := range names {
		names[i] = strconv.Itoa(i)
	}
	load := svgplot.Panel{
		Title: fmt.Sprintf("each primary's CPU at %d gateways and %d primaries (1: one core saturated)", at.Gateways, n),
		X:     svgplot.Bands{Label: "Redis primary", Names: names},
		Y:     svgplot.Axis{Label: "cores busy", Log: true},
	}
	counts := []int{1}
	for c := 2; c < 4*n && c <= 1024; c *= 2 {
		counts = append(counts, c)
	}
	if counts[len(counts)-1] < n {
		counts = append(counts, n)
	}
	countNames := make([]string, len(counts))
	for i, c := range counts {
		countNames[i] = strconv.Itoa(c)
	}
	served := svgplot.Panel{
		Title: "decisions a second served, each mode on its own gateways, as primaries are added",
		X:     svgplot.Bands{Label: "Redis primaries", Names: countNames},
		Y:     svgplot.Axis{Label: "millions of decisions/s"},
	}
	offered := make([]float64, len(counts))
	for i := range offered {
		offered[i] = at.Rate / 1e6
	}
	for _, r := range rows {
		f := r.Fleet
		f.Primaries = n
		f.Gateways = at.Gateways
		same, err := Model(f)
		if err != nil {
			return nil, err
		}
		cpu := make([]float64, n)
		for i, p := range same.Primaries {
			cpu[i] = p.CPU
			if p.CPU <= 0 {
				cpu[i] = math.NaN()
			}
		}
		load.Series = append(load.Series, svgplot.Series{Name: r.Mode, Class: "cpu_" + r.Mode, Kind: svgplot.Bar, Stack: r.Mode, Color: modeColor[r.Mode], Values: cpu})
		line := make([]float64, len(counts))
		f = r.Fleet
		for i, c := range counts {
			f.Primaries = c
			m, err := Model(f)
			if err != nil {
				return nil, err
			}
			line[i] = m.Served / 1e6
		}
		served.Series = append(served.Series, svgplot.Series{Name: fmt.Sprintf("%s, %d gateways", r.Mode, r.Gateways), Class: "served_" + r.Mode, Kind: svgplot.Line, Color: modeColor[r.Mode], Values: line})
	}
	core := make([]float64, n)
	for i := range core {
		core[i] = 1
	}
	load.Series = append(load.Series, svgplot.Series{Name: "one core", Class: "one_core", Kind: svgplot.Step, Color: "#212121", Dash: true, Values: core})
	served.Series = append(served.Series, svgplot.Series{Name: "offered", Class: "offered", Kind: svgplot.Step, Color: "#212121", Dash: true, Values: offered})
	title := fmt.Sprintf("fleetsim: %s decisions/s at the %s door, hot key %v%% of them", group(at.Rate), at.Door, 100*at.HotShare)
	return &svgplot.Chart{
		Title: title,
		Subtitle: []string{
			fmt.Sprintf("%d keys beside it (Zipf %v), %d cores a gateway; leased: max_slice %s%%, overshoot at most %s%% of the hot key's capacity", at.Keys, at.Zipf, at.Cores, pct(at.MaxSlice), pct(at.Bound)),
			"costs measured by the benchmarks costs.go names; queueing model in Model's comment",
		},
		Desc:   title + ": each Redis primary's CPU in the exact, leased and sharded modes, and the decisions served as primaries are added.",
		Panels: []svgplot.Panel{load, served},
	}, nil
}
