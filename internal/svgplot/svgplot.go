// Package svgplot draws sluice's charts (sluice simulate --svg, the
// benchmark charts) as plain SVG: one self-contained file, no scripts,
// fonts or styles from elsewhere, every text and attribute escaped by
// encoding/xml.
//
// A chart is read by people and checked by tests, so each element that
// shows a value also carries it: a bar has data-series, data-index and
// data-value; a line has data-series with data-indexes and data-values,
// one per point of its polyline; an axis tick has data-axis and
// data-value at the pixel where that value lies. A test can thus compare
// the values with what it expects and map the geometry back through the
// ticks to see that the picture shows them.
package svgplot

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/defaults"
)

// Chart is a title, a legend and one or more panels stacked vertically,
// each with the same width.
type Chart struct {
	Title string
	// Subtitle is the lines under the title, smaller.
	Subtitle []string
	// Desc is the chart's <desc>: what a screen reader says of it.
	Desc string
	// Width in pixels; 0: 820.
	Width  float64
	Panels []Panel
}

// Panel is one plot area with its axes.
type Panel struct {
	// Title is written above the plot area; may be empty.
	Title string
	// Height of the plot area in pixels; 0: 220.
	Height float64
	X      Bands
	Y      Axis
	// Y2 is the right-hand axis of the series with Right set.
	Y2     *Axis
	Series []Series
}

// Bands is a panel's x axis: one band of equal width per name. A bar
// series draws a bar in each band, a line a point at its center, a step
// line a level across it.
type Bands struct {
	Label string
	Names []string
	// AtEdges puts the tick labels at the bands' left edges (the name is
	// where an interval starts, as for time) rather than their centers.
	AtEdges bool
}

// Axis is a value axis.
type Axis struct {
	Label string
	// Min and Max bound the axis; when Max <= Min they come from the
	// data, rounded out to whole ticks (a linear axis starts at 0 unless
	// the data go below).
	Min, Max float64
	// Log draws the axis on a base-10 logarithmic scale (values > 0).
	Log bool
	// Whole keeps the ticks on whole numbers: an axis of counts.
	Whole bool
	// Format writes a tick's value; nil: FormatValue.
	Format func(float64) string
}

// Kind is how a series is drawn.
type Kind int

const (
	// Bar draws a bar per band; bars of the same Stack pile up (on a
	// linear axis: on a logarithmic one each rises from the axis' foot).
	Bar Kind = iota
	// Line joins the points at the bands' centers.
	Line
	// Step draws each value as a level across its band, joined by
	// vertical segments: a count per interval, drawn as what it is.
	Step
)

// Series is one named set of values, one per band (NaN: no value).
type Series struct {
	// Name is shown in the legend.
	Name string
	// Class is the data-series attribute (and class) of the series'
	// elements: what a test looks for. Empty: Name.
	Class string
	Color string
	Kind  Kind
	// Stack groups bars that pile up in a band; bars of different stacks
	// stand side by side.
	Stack string
	Dash  bool
	// Right plots the series against the panel's Y2.
	Right  bool
	Values []float64
}

func (s Series) class() string {
	if s.Class != "" {
		return s.Class
	}
	return s.Name
}

// Layout, in pixels.
const (
	defaultWidth   = 820
	defaultHeight  = 220
	marginLeft     = 76
	marginRight    = 24
	marginRight2   = 76 // with a right-hand axis
	titleSize      = 16
	textSize       = 12
	lineGap        = 18
	charWidth      = 7  // an estimate at textSize, for spacing labels
	titleCharWidth = 10 // at titleSize, bold
)

// wrap breaks each line at spaces into lines of at most n runes (a word
// longer than n stays whole).
func wrap(lines []string, n int) []string {
	var out []string
	for _, line := range lines {
		cur := ""
		for _, word := range strings.Fields(line) {
			switch {
			case cur == "":
				cur = word
			case len([]rune(cur))+1+len([]rune(word)) <= n:
				cur += " " + word
			default:
				out = append(out, cur)
				cur = word
			}
		}
		out = append(out, cur)
	}
	return out
}

// FormatValue writes v as the axes do by default: a whole number with
// thousands separators, or up to three significant decimals.
func FormatValue(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return groupThousands(strconv.FormatFloat(v, 'f', 0, 64))
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func groupThousands(s string) string {
	digits := strings.TrimPrefix(s, "-")
	var b strings.Builder
	b.WriteString(s[:len(s)-len(digits)]) // the sign
	for i, c := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// NiceTicks returns about n evenly spaced round values (1, 2 or 5 times a
// power of ten apart) from at or below lo to at or above hi.
func NiceTicks(lo, hi float64, n int) []float64 { return niceTicks(lo, hi, n, 0) }

// niceTicks is NiceTicks with ticks at least least apart.
func niceTicks(lo, hi float64, n int, least float64) []float64 {
	if !(hi > lo) || math.IsInf(hi-lo, 0) || math.IsNaN(hi-lo) {
		return []float64{lo}
	}
	n = max(n, 1)
	raw := (hi - lo) / float64(n)
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	step := pow * 10
	for _, m := range []float64{1, 2, 5, 10} {
		if m*pow >= raw {
			step = m * pow
			break
		}
	}
	if step < least {
		step, pow = least, least
	}
	// Each tick is a whole number of steps, computed in whole numbers of
	// the power of ten (or divided by its inverse), so that 0.2 * 3 is
	// written 0.6.
	unit := step / pow
	at := func(k float64) float64 {
		if pow < 1 {
			return k * unit / math.Round(1/pow)
		}
		return k * unit * pow
	}
	first := math.Floor(lo / step)
	var ticks []float64
	for i := 0; ; i++ {
		v := at(first + float64(i))
		ticks = append(ticks, v)
		if v >= hi || i > 4*n+4 {
			return ticks
		}
	}
}

// logTicks returns the powers of ten from at or below lo to at or above hi.
func logTicks(lo, hi float64) []float64 {
	var ticks []float64
	for e := math.Floor(math.Log10(lo)); ; e++ {
		v := math.Pow(10, e)
		ticks = append(ticks, v)
		if v >= hi || len(ticks) > 30 {
			return ticks
		}
	}
}

// scale maps an axis' values to pixels between bottom and top.
type scale struct {
	lo, hi      float64
	log         bool
	bottom, top float64
	ticks       []float64
	format      func(float64) string
}

// newScale fits a to the values it shows.
func newScale(a Axis, values [][]float64, bottom, top float64) scale {
	s := scale{log: a.Log, bottom: bottom, top: top, format: a.Format}
	least := 0.0
	if a.Whole {
		least = 1
	}
	if s.format == nil {
		s.format = FormatValue
	}
	if a.Max > a.Min && (!a.Log || a.Min > 0) {
		s.lo, s.hi = a.Min, a.Max
		if a.Log {
			s.ticks = logTicks(s.lo, s.hi)
			s.lo, s.hi = s.ticks[0], s.ticks[len(s.ticks)-1]
		} else {
			s.ticks = within(niceTicks(s.lo, s.hi, 5, least), s.lo, s.hi)
		}
		return s
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, vs := range values {
		for _, v := range vs {
			if math.IsNaN(v) || math.IsInf(v, 0) || (a.Log && v <= 0) {
				continue
			}
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if a.Log {
		if math.IsInf(lo, 1) {
			lo, hi = 1, 10
		}
		s.ticks = logTicks(lo, hi)
		if len(s.ticks) == 1 {
			s.ticks = append(s.ticks, s.ticks[0]*10)
		}
	} else {
		if math.IsInf(lo, 1) {
			lo, hi = 0, 1
		}
		lo = min(lo, 0)
		if hi <= lo {
			hi = lo + 1
		}
		s.ticks = niceTicks(lo, hi, 5, least)
	}
	s.lo, s.hi = s.ticks[0], s.ticks[len(s.ticks)-1]
	return s
}

// within keeps the ticks in [lo, hi] (an axis with fixed bounds draws no
// tick beyond them).
func within(ticks []float64, lo, hi float64) []float64 {
	var out []float64
	for _, t := range ticks {
		if t >= lo-1e-9*math.Abs(hi-lo) && t <= hi+1e-9*math.Abs(hi-lo) {
			out = append(out, t)
		}
	}
	return out
}

// at is the pixel of v, clamped to the plot area.
func (s scale) at(v float64) float64 {
	var f float64
	if s.log {
		if v <= 0 {
			return s.bottom
		}
		f = (math.Log10(v) - math.Log10(s.lo)) / (math.Log10(s.hi) - math.Log10(s.lo))
	} else {
		f = (v - s.lo) / (s.hi - s.lo)
	}
	f = min(max(f, 0), 1)
	return s.bottom + f*(s.top-s.bottom)
}

// svg writes elements through an xml.Encoder, which escapes every text and
// attribute value; the first error sticks and ends the writing.
type svg struct {
	enc *xml.Encoder
	err error
}

type attr = xml.Attr

func a(name, value string) attr { return xml.Attr{Name: xml.Name{Local: name}, Value: value} }

func px(v float64) string { return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) }

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func (w *svg) open(name string, attrs ...attr) {
	if w.err == nil {
		w.err = w.enc.EncodeToken(xml.StartElement{Name: xml.Name{Local: name}, Attr: attrs})
	}
}

func (w *svg) close(name string) {
	if w.err == nil {
		w.err = w.enc.EncodeToken(xml.EndElement{Name: xml.Name{Local: name}})
	}
}

func (w *svg) text(s string) {
	if w.err == nil {
		w.err = w.enc.EncodeToken(xml.CharData(s))
	}
}

// elem writes an element with attributes and, when given, a text.
func (w *svg) elem(name, text string, attrs ...attr) {
	w.open(name, attrs...)
	if text != "" {
		w.text(text)
	}
	w.close(name)
}

// WriteSVG draws the chart.
func (c *Chart) WriteSVG(out io.Writer) error {
	width := c.Width
	defaults.Set(&width, defaultWidth)
	right := float64(marginRight)
	for _, p := range c.Panels {
		if p.Y2 != nil {
			right = marginRight2
		}
	}
	plotL, plotR := float64(marginLeft), width-right

	// The title block: title, subtitles, legend rows.
	y := 10.0 + titleSize
	titleY := y
	// Lines too long for the width are wrapped at spaces, by an estimate
	// of the glyphs' width (the font is the reader's).
	titles := wrap([]string{c.Title}, int((width-plotL-8)/titleCharWidth))
	y += float64(len(titles)-1) * (titleSize + 4)
	subtitles := wrap(c.Subtitle, int((width-plotL-8)/charWidth))
	y += float64(len(subtitles)) * lineGap
	legendRows := legendLayout(c.legend(), plotL, plotR)
	legendY := y + lineGap
	if len(legendRows) > 0 {
		y = legendY + float64(len(legendRows)-1)*lineGap
	}
	y += 14

	type placed struct {
		p            *Panel
		top, bottom  float64
		titleBaselne float64
	}
	var panels []placed
	for i := range c.Panels {
		p := &c.Panels[i]
		h := p.Height
		defaults.Set(&h, defaultHeight)
		var tb float64
		if p.Title != "" {
			y += lineGap
			tb = y
		}
		top := y + 10
		panels = append(panels, placed{p, top, top + h, tb})
		// Below the plot: tick labels, the axis label and a gap.
		y = top + h + 16 + lineGap + 14
	}
	height := y

	enc := xml.NewEncoder(out)
	w := &svg{enc: enc}
	w.open("svg", a("xmlns", "http://www.w3.org/2000/svg"), a("version", "1.1"),
		a("width", px(width)), a("height", px(height)), a("viewBox", "0 0 "+px(width)+" "+px(height)),
		a("role", "img"), a("aria-labelledby", "title desc"),
		a("font-family", "DejaVu Sans, Helvetica, Arial, sans-serif"), a("font-size", strconv.Itoa(textSize)))
	w.elem("title", c.Title, a("id", "title"))
	w.elem("desc", c.Desc, a("id", "desc"))
	w.elem("rect", "", a("width", "100%"), a("height", "100%"), a("fill", "#ffffff"))
	for i, t := range titles {
		w.elem("text", t, a("class", "title"), a("x", px(plotL)), a("y", px(titleY+float64(i)*(titleSize+4))), a("font-size", strconv.Itoa(titleSize)), a("font-weight", "bold"))
	}
	titleY += float64(len(titles)-1) * (titleSize + 4)
	for i, s := range subtitles {
		w.elem("text", s, a("class", "subtitle"), a("x", px(plotL)), a("y", px(titleY+float64(i+1)*lineGap)), a("fill", "#444444"))
	}
	w.drawLegend(legendRows, legendY)
	for _, pl := range panels {
		if pl.p.Title != "" {
			w.elem("text", pl.p.Title, a("class", "panel-title"), a("x", px(plotL)), a("y", px(pl.titleBaselne)), a("font-weight", "bold"))
		}
		w.drawPanel(pl.p, plotL, plotR, pl.top, pl.bottom)
	}
	w.close("svg")
	if w.err != nil {
		return w.err
	}
	if err := enc.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(out, "\n")
	return err
}

// legendEntry is one series' swatch and name.
type legendEntry struct {
	s     Series
	x     float64
	width float64
}

// legend lists each series once, by name, in the order of the panels.
func (c *Chart) legend() []Series {
	seen := map[string]bool{}
	var out []Series
	for _, p := range c.Panels {
		for _, s := range p.Series {
			if s.Name == "" || seen[s.Name] {
				continue
			}
			seen[s.Name] = true
			out = append(out, s)
		}
	}
	return out
}

func legendLayout(series []Series, left, right float64) [][]legendEntry {
	var rows [][]legendEntry
	x := left
	for _, s := range series {
		w := 22 + float64(len([]rune(s.Name)))*charWidth + 18
		if len(rows) == 0 || (x+w > right && x > left) {
			rows = append(rows, nil)
			x = left
		}
		rows[len(rows)-1] = append(rows[len(rows)-1], legendEntry{s, x, w})
		x += w
	}
	return rows
}

func (w *svg) drawLegend(rows [][]legendEntry, y0 float64) {
	if len(rows) == 0 {
		return
	}
	w.open("g", a("class", "legend"))
	for r, row := range rows {
		y := y0 + float64(r)*lineGap
		for _, e := range row {
			w.open("g", a("class", "legend-entry"), a("data-series", e.s.class()))
			if e.s.Kind == Bar {
				w.elem("rect", "", a("x", px(e.x)), a("y", px(y-10)), a("width", "16"), a("height", "10"), a("fill", e.s.Color))
			} else {
				attrs := []attr{a("x1", px(e.x)), a("y1", px(y-5)), a("x2", px(e.x+16)), a("y2", px(y-5)), a("stroke", e.s.Color), a("stroke-width", "2.5")}
				if e.s.Dash {
					attrs = append(attrs, a("stroke-dasharray", "5 3"))
				}
				w.elem("line", "", attrs...)
			}
			w.elem("text", e.s.Name, a("x", px(e.x+22)), a("y", px(y)))
			w.close("g")
		}
	}
	w.close("g")
}

func (w *svg) drawPanel(p *Panel, left, right, top, bottom float64) {
	g := plotArea{p: p, left: left, right: right, top: top, bottom: bottom}
	g.ys, g.ys2 = panelScales(p, bottom, top)
	g.n = max(len(p.X.Names), 1)
	g.band = (right - left) / float64(g.n)

	w.open("g", a("class", "panel"), a("data-bands", strconv.Itoa(len(p.X.Names))))
	w.elem("rect", "", a("class", "plot-area"), a("x", px(left)), a("y", px(top)), a("width", px(right-left)), a("height", px(bottom-top)), a("fill", "#fafafa"), a("stroke", "#bbbbbb"))

	// The left axis: grid lines with their values, and its label.
	w.valueAxis("y", g.ys, left, right, left-6, "end", p.Y.Label, 18, -90)
	if p.Y2 != nil {
		w.valueAxis("y2", g.ys2, right, right+5, right+8, "start", p.Y2.Label, right+marginRight2-18, 90)
	}
	w.drawBands(g)
	// Bars first, so that lines are drawn over them.
	w.drawBars(g)
	for _, s := range p.Series {
		if s.Kind != Bar {
			w.drawLine(g, s)
		}
	}
	w.close("g")
}

// plotArea is a panel placed on the page: its plot area's edges, its
// bands and its scales.
type plotArea struct {
	p                        *Panel
	left, right, top, bottom float64
	n                        int     // bands, at least 1
	band                     float64 // a band's width
	ys, ys2                  scale
}

// scaleOf is the scale that s is plotted against.
func (g plotArea) scaleOf(s Series) scale {
	if s.Right {
		return g.ys2
	}
	return g.ys
}

// pointLabel is the title of s's value v in band i.
func (g plotArea) pointLabel(s Series, i int, v float64) string {
	label := s.Name + ": " + FormatValue(v)
	if i < len(g.p.X.Names) {
		label = g.p.X.Names[i] + ", " + label
	}
	return label
}

// panelScales are p's left and right scales (the right one zero without
// a Y2), each spanning its series' values.
func panelScales(p *Panel, bottom, top float64) (ys, ys2 scale) {
	var leftVals, rightVals [][]float64
	// Stacked bars reach the sum of their stack: the axis must too.
	stackTop := map[string][]float64{}
	for _, s := range p.Series {
		vals := s.Values
		if s.Kind == Bar {
			acc := stackTop[s.Stack]
			if acc == nil {
				acc = make([]float64, len(p.X.Names))
			}
			for i := range acc {
				if i < len(s.Values) && !math.IsNaN(s.Values[i]) {
					acc[i] += s.Values[i]
				}
			}
			stackTop[s.Stack] = acc
			vals = acc
		}
		if s.Right {
			rightVals = append(rightVals, vals)
		} else {
			leftVals = append(leftVals, vals)
		}
	}
	ys = newScale(p.Y, leftVals, bottom, top)
	if p.Y2 != nil {
		ys2 = newScale(*p.Y2, rightVals, bottom, top)
	}
	return ys, ys2
}

// drawBands draws the x axis: a label every few bands, so that they do
// not overlap.
func (w *svg) drawBands(g plotArea) {
	p, left, band, bottom := g.p, g.left, g.band, g.bottom
	w.open("g", a("class", "axis"), a("data-axis", "x"))
	longest := 1
	for _, name := range p.X.Names {
		longest = max(longest, len([]rune(name)))
	}
	every := everyNth(float64(longest*charWidth+12), band)
	for i, name := range p.X.Names {
		if i%every != 0 {
			continue
		}
		x := left + (float64(i)+0.5)*band
		if p.X.AtEdges {
			x = left + float64(i)*band
		}
		w.elem("line", "", a("class", "tick"), a("data-axis", "x"), a("data-index", strconv.Itoa(i)),
			a("x1", px(x)), a("y1", px(bottom)), a("x2", px(x)), a("y2", px(bottom+4)), a("stroke", "#666666"))
		w.elem("text", name, a("x", px(x)), a("y", px(bottom+16)), a("text-anchor", "middle"))
	}
	w.elem("text", p.X.Label, a("class", "axis-label"), a("x", px((left+g.right)/2)), a("y", px(bottom+16+lineGap)), a("text-anchor", "middle"))
	w.close("g")
}

// drawBars draws the bar series: the stacks of a band side by side, the
// bars of a stack piled up.
func (w *svg) drawBars(g plotArea) {
	p, left, band, n := g.p, g.left, g.band, g.n
	var stacks []string
	for _, s := range p.Series {
		if s.Kind == Bar && !slices.Contains(stacks, s.Stack) {
			stacks = append(stacks, s.Stack)
		}
	}
	base := map[string][]float64{}
	for _, s := range p.Series {
		if s.Kind != Bar {
			continue
		}
		sc := g.scaleOf(s)
		slot := slices.Index(stacks, s.Stack)
		gap := band * 0.2
		if band < 4 {
			gap = 0
		}
		bw := (band - gap) / float64(len(stacks))
		if base[s.Stack] == nil {
			base[s.Stack] = make([]float64, n)
		}
		b := base[s.Stack]
		w.open("g", a("class", "series bar "+s.class()), a("data-series", s.class()), a("data-axis", axisOf(s)), a("fill", s.Color))
		for i, v := range s.Values {
			if i >= n || math.IsNaN(v) {
				continue
			}
			x := left + float64(i)*band + gap/2 + float64(slot)*bw
			y0, y1 := sc.at(b[i]), sc.at(b[i]+v)
			if sc.log {
				// A log axis has no zero: a bar rises from the axis' foot,
				// and bars of a stack overlap rather than pile up.
				y0, y1 = sc.bottom, sc.at(v)
			}
			w.open("rect", a("data-series", s.class()), a("data-index", strconv.Itoa(i)), a("data-value", num(v)),
				a("x", px(x)), a("y", px(y1)), a("width", px(bw)), a("height", px(y0-y1)))
			w.elem("title", g.pointLabel(s, i, v))
			w.close("rect")
			b[i] += v
		}
		w.close("g")
	}
}

// drawLine draws a line or step series as one polyline, with marks on
// its points while there are few enough to tell apart.
func (w *svg) drawLine(g plotArea, s Series) {
	left, band, n := g.left, g.band, g.n
	sc := g.scaleOf(s)
	var pts, idx, vals []string
	for i, v := range s.Values {
		if i >= n || math.IsNaN(v) {
			continue
		}
		y := sc.at(v)
		if s.Kind == Step {
			pts = append(pts, px(left+float64(i)*band)+","+px(y), px(left+float64(i+1)*band)+","+px(y))
		} else {
			pts = append(pts, px(left+(float64(i)+0.5)*band)+","+px(y))
		}
		idx = append(idx, strconv.Itoa(i))
		vals = append(vals, num(v))
	}
	attrs := []attr{a("class", "series line "+s.class()), a("data-series", s.class()), a("data-axis", axisOf(s)), a("data-kind", kindName(s.Kind)),
		a("data-indexes", strings.Join(idx, " ")), a("data-values", strings.Join(vals, " ")),
		a("points", strings.Join(pts, " ")), a("fill", "none"), a("stroke", s.Color), a("stroke-width", "2"), a("stroke-linejoin", "round")}
	if s.Dash {
		attrs = append(attrs, a("stroke-dasharray", "5 3"))
	}
	w.open("polyline", attrs...)
	w.elem("title", s.Name)
	w.close("polyline")
	if s.Kind != Line || len(vals) > 40 {
		return
	}
	w.open("g", a("class", "marks "+s.class()), a("fill", s.Color))
	for i, v := range s.Values {
		if i >= n || math.IsNaN(v) {
			continue
		}
		w.open("circle", a("cx", px(left+(float64(i)+0.5)*band)), a("cy", px(sc.at(v))), a("r", "3"))
		w.elem("title", g.pointLabel(s, i, v))
		w.close("circle")
	}
	w.close("g")
}

func axisOf(s Series) string {
	if s.Right {
		return "y2"
	}
	return "y"
}

func kindName(k Kind) string {
	switch k {
	case Step:
		return "step"
	case Line:
		return "line"
	}
	return "bar"
}

// valueAxis draws an axis' ticks from x1 to x2 (the left axis' span the
// plot as grid lines, the right axis' are short marks outside it), their
// values, and the axis' label turned along it.
func (w *svg) valueAxis(name string, s scale, x1, x2, labelX float64, anchor, label string, titleX, rotate float64) {
	scaleName := "linear"
	if s.log {
		scaleName = "log"
	}
	w.open("g", a("class", "axis"), a("data-axis", name), a("data-scale", scaleName))
	for _, t := range s.ticks {
		y := s.at(t)
		w.elem("line", "", a("class", "tick"), a("data-axis", name), a("data-value", num(t)),
			a("x1", px(x1)), a("y1", px(y)), a("x2", px(x2)), a("y2", px(y)), a("stroke", tickColor(name)))
		w.elem("text", s.format(t), a("x", px(labelX)), a("y", px(y+4)), a("text-anchor", anchor))
	}
	mid := (s.top + s.bottom) / 2
	w.elem("text", label, a("class", "axis-label"), a("x", px(titleX)), a("y", px(mid)), a("text-anchor", "middle"),
		a("transform", fmt.Sprintf("rotate(%s %s %s)", num(rotate), px(titleX), px(mid))))
	w.close("g")
}

func tickColor(axis string) string {
	if axis == "y" {
		return "#e0e0e0"
	}
	return "#666666"
}

// everyNth is how many bands one label needs so that labels of width
// need do not overlap: 1, 2 or 5 times a power of ten, so that a time
// axis is labelled at round steps.
func everyNth(need, band float64) int {
	if band <= 0 {
		return 1
	}
	k := need / band
	for p := 1; ; p *= 10 {
		for _, m := range []int{1, 2, 5} {
			if float64(m*p) >= k {
				return m * p
			}
		}
		if p > 1e9 {
			return p
		}
	}
}
