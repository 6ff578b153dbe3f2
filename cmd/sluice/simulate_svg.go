package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/svgplot"
)

// Colours of the simulate chart, one per series, the same in every chart.
const (
	colorAdmitted = "#2e7d32"
	colorRejected = "#c62828"
	colorOffered  = "#212121"
	colorTokens   = "#1565c0"
	colorQueued   = "#ef6c00"
)

// simChart draws the series the table prints: per step, the requests
// offered (a level across the step), admitted and rejected (bars piled up
// to what was offered); below, the whole tokens left after the step's
// last request and, when requests reserve, the longest wait of one
// admitted in the step. The elements carry the series' exact numbers
// (svgplot's data-* attributes), which the tests compare with the
// simulation's.
func simChart(s *simSeries, pattern string) *svgplot.Chart {
	n := len(s.Steps)
	names := make([]string, n)
	offered, admitted, rejected := make([]float64, n), make([]float64, n), make([]float64, n)
	left, waited := make([]float64, n), make([]float64, n)
	most := s.Capacity
	for i, r := range s.Steps {
		names[i] = shortDuration(time.Duration(r.From))
		offered[i], admitted[i], rejected[i] = float64(r.Offered), float64(r.Admitted), float64(r.Rejected)
		left[i], waited[i] = float64(r.Left), time.Duration(r.Queued).Seconds()
		most = max(most, left[i])
	}
	step := shortDuration(time.Duration(s.Step))
	t := s.totals()
	share := 0.0
	if t.Offered > 0 {
		share = 100 * float64(t.Admitted) / float64(t.Offered)
	}
	totals := fmt.Sprintf("total: %d offered, %d admitted (%.1f%%), %d rejected", t.Offered, t.Admitted, share, t.Rejected)
	if t.Queued > 0 {
		totals += fmt.Sprintf("; the longest queued %v", time.Duration(t.Queued).Round(time.Millisecond))
	}
	how := fmt.Sprintf("key %q, each request asks %s", printable(s.Key), tokens(s.Cost))
	if s.Reserve {
		how += ", requests reserve"
	}
	if s.Shadow {
		how += ", shadow mode (serve admits every request: the counts say what enforcing would do)"
	}
	timeAxis := svgplot.Bands{Label: "time since the start (one step: " + step + ")", Names: names, AtEdges: true}
	bucket := svgplot.Panel{
		Title: "the bucket",
		X:     timeAxis,
		Y:     svgplot.Axis{Label: "tokens left", Min: slices.Min(append([]float64{0}, left...)), Max: most, Whole: true},
		Series: []svgplot.Series{
			{Name: "tokens left (after the step's last request)", Class: "tokens_left", Kind: svgplot.Step, Color: colorTokens, Values: left},
		},
	}
	if strings.HasPrefix(s.Description, "fixed window") || strings.HasPrefix(s.Description, "sliding log") {
		bucket.Title = "the window"
	}
	if s.Reserve {
		bucket.Y2 = &svgplot.Axis{Label: "longest queued wait (s)", Format: secondsTick}
		bucket.Series = append(bucket.Series, svgplot.Series{Name: "longest queued wait (s)", Class: "queued_s", Kind: svgplot.Step, Color: colorQueued, Dash: true, Right: true, Values: waited})
	}
	return &svgplot.Chart{
		Title:    fmt.Sprintf("sluice simulate: limit %s, %s", s.Limit, s.Description),
		Subtitle: []string{"pattern " + pattern + "; " + how, totals},
		Desc:     fmt.Sprintf("Requests offered, admitted and rejected per %s step of the pattern %s against limit %s (%s), and the tokens left after each step. %s.", step, pattern, s.Limit, s.Description, totals),
		Panels: []svgplot.Panel{
			{
				Title: "requests per step",
				X:     timeAxis,
				Y:     svgplot.Axis{Label: "requests per " + step, Whole: true},
				Series: []svgplot.Series{
					{Name: "admitted", Class: "admitted", Kind: svgplot.Bar, Stack: "requests", Color: colorAdmitted, Values: admitted},
					{Name: "rejected", Class: "rejected", Kind: svgplot.Bar, Stack: "requests", Color: colorRejected, Values: rejected},
					{Name: "offered", Class: "offered", Kind: svgplot.Step, Color: colorOffered, Values: offered},
				},
			},
			bucket,
		},
	}
}

// secondsTick writes a wait in seconds as the table does ("50ms", "1.5s").
func secondsTick(v float64) string {
	if v == 0 {
		return "0"
	}
	return shortDuration(time.Duration(v * float64(time.Second)).Round(time.Millisecond))
}

// writeSimSVG draws the series as an SVG chart.
func writeSimSVG(w io.Writer, s *simSeries, pattern string) error {
	return simChart(s, pattern).WriteSVG(w)
}
