package svgplot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Picture is what Read finds in a chart WriteSVG drew: for tests, which
// check both the values it carries and the values its geometry shows.
type Picture struct {
	Title  string
	Legend []string // the legend's data-series, in order
	Panels []PanelRead
}

// PanelRead is one panel's series by data-series.
type PanelRead struct {
	Bands  int
	Series map[string]*SeriesRead
}

// SeriesRead is one series as drawn.
type SeriesRead struct {
	Kind string // bar, line or step
	Axis string // y or y2
	// Index and Value are the data-index and data-value of each bar, or
	// the data-indexes and data-values of a line.
	Index []int
	Value []float64
	// DrawnIndex and Drawn are the band and the value each bar or point
	// shows, read back from its position through the axis' ticks.
	DrawnIndex []int
	Drawn      []float64
	// Resolution is how close Drawn can be to Value, given the rounding
	// of the coordinates (a few hundredths of a pixel on the axis).
	Resolution []float64
}

// Read parses an SVG that WriteSVG wrote, as XML, and reads the values
// and their geometry back.
func Read(data []byte) (*Picture, error) {
	var root node
	if err := xml.NewDecoder(bytes.NewReader(data)).Decode(&root); err != nil {
		return nil, fmt.Errorf("svg: %w", err)
	}
	if root.XMLName.Local != "svg" {
		return nil, fmt.Errorf("root element %q, want svg", root.XMLName.Local)
	}
	pic := &Picture{}
	for _, n := range root.Nodes {
		switch {
		case n.XMLName.Local == "title":
			pic.Title = n.Text
		case n.attr("class") == "legend":
			for _, e := range n.Nodes {
				pic.Legend = append(pic.Legend, e.attr("data-series"))
			}
		case n.attr("class") == "panel":
			p, err := readPanel(n)
			if err != nil {
				return nil, err
			}
			pic.Panels = append(pic.Panels, *p)
		}
	}
	return pic, nil
}

type node struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Text    string     `xml:",chardata"`
	Nodes   []node     `xml:",any"`
}

func (n *node) attr(name string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (n *node) float(name string) (float64, error) {
	v, err := strconv.ParseFloat(n.attr(name), 64)
	if err != nil {
		return 0, fmt.Errorf("<%s> %s=%q: %w", n.XMLName.Local, name, n.attr(name), err)
	}
	return v, nil
}

// axisMap maps a pixel back to a value, from an axis' first and last ticks.
type axisMap struct {
	log    bool
	y0, y1 float64
	v0, v1 float64
}

func (m axisMap) value(y float64) float64 {
	f := (y - m.y0) / (m.y1 - m.y0)
	if m.log {
		return math.Pow(10, math.Log10(m.v0)+f*(math.Log10(m.v1)-math.Log10(m.v0)))
	}
	return m.v0 + f*(m.v1-m.v0)
}

// resolution is the value three hundredths of a pixel make at y: WriteSVG
// rounds every coordinate, the ticks' too, to a hundredth.
func (m axisMap) resolution(y float64) float64 { return math.Abs(m.value(y+0.03) - m.value(y)) }

func readPanel(p node) (*PanelRead, error) {
	bands, err := p.float("data-bands")
	if err != nil {
		return nil, err
	}
	out := &PanelRead{Bands: int(bands), Series: map[string]*SeriesRead{}}
	left, width, axes, err := readAxes(p)
	if err != nil {
		return nil, err
	}
	if bands <= 0 || width <= 0 {
		return nil, errors.New("a panel without bands or plot area")
	}
	band := width / bands
	bandOf := func(x float64) int { return int(math.Floor((x - left) / band)) }
	for _, n := range p.Nodes {
		if !strings.HasPrefix(n.attr("class"), "series ") {
			continue
		}
		name, axis := n.attr("data-series"), n.attr("data-axis")
		m, ok := axes[axis]
		if !ok {
			return nil, fmt.Errorf("series %q on axis %q, which has no ticks", name, axis)
		}
		s := out.Series[name]
		if s != nil {
			return nil, fmt.Errorf("series %q drawn twice in a panel", name)
		}
		s = &SeriesRead{Axis: axis}
		out.Series[name] = s
		if n.XMLName.Local == "g" { // bars
			err = readBars(n, m, bandOf, s)
		} else {
			err = readLine(n, name, m, bandOf, s)
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readAxes reads a panel's plot area (its left edge and width) and, from
// the first and last ticks of each value axis, the map from its pixels
// back to values.
func readAxes(p node) (left, width float64, axes map[string]axisMap, err error) {
	axes = map[string]axisMap{}
	for _, n := range p.Nodes {
		switch {
		case n.attr("class") == "plot-area":
			if left, err = n.float("x"); err != nil {
				return 0, 0, nil, err
			}
			if width, err = n.float("width"); err != nil {
				return 0, 0, nil, err
			}
		case n.attr("class") == "axis" && n.attr("data-axis") != "x":
			m, err := readAxis(n)
			if err != nil {
				return 0, 0, nil, err
			}
			axes[n.attr("data-axis")] = m
		}
	}
	return left, width, axes, nil
}

// readAxis maps an axis' pixels back to values by its first and last ticks.
func readAxis(n node) (axisMap, error) {
	var ticks []node
	for _, t := range n.Nodes {
		if t.attr("class") == "tick" {
			ticks = append(ticks, t)
		}
	}
	if len(ticks) < 2 {
		return axisMap{}, fmt.Errorf("axis %s has %d ticks, want 2 or more", n.attr("data-axis"), len(ticks))
	}
	m := axisMap{log: n.attr("data-scale") == "log"}
	first, last := ticks[0], ticks[len(ticks)-1]
	var err error
	for _, f := range []struct {
		n    node
		y, v *float64
	}{{first, &m.y0, &m.v0}, {last, &m.y1, &m.v1}} {
		if *f.y, err = f.n.float("y1"); err != nil {
			return axisMap{}, err
		}
		if *f.v, err = f.n.float("data-value"); err != nil {
			return axisMap{}, err
		}
	}
	if m.y0 == m.y1 {
		return axisMap{}, errors.New("two ticks of an axis at one height")
	}
	return m, nil
}

// readBars reads a bar series' rects into s.
func readBars(n node, m axisMap, bandOf func(float64) int, s *SeriesRead) error {
	s.Kind = "bar"
	for _, r := range n.Nodes {
		if r.XMLName.Local != "rect" {
			continue
		}
		vals := map[string]float64{}
		for _, k := range []string{"data-index", "data-value", "x", "y", "width", "height"} {
			var err error
			if vals[k], err = r.float(k); err != nil {
				return err
			}
		}
		s.Index = append(s.Index, int(vals["data-index"]))
		s.Value = append(s.Value, vals["data-value"])
		s.DrawnIndex = append(s.DrawnIndex, bandOf(vals["x"]+vals["width"]/2))
		top, bottom := vals["y"], vals["y"]+vals["height"]
		if m.log { // from the axis' foot, whatever its value
			s.Drawn = append(s.Drawn, m.value(top))
			s.Resolution = append(s.Resolution, m.resolution(top))
		} else {
			s.Drawn = append(s.Drawn, m.value(top)-m.value(bottom))
			s.Resolution = append(s.Resolution, m.resolution(top)+m.resolution(bottom))
		}
	}
	return nil
}

// readLine reads a line or step series' polyline into s: its values and
// indexes from the data attributes, what it shows from its points.
func readLine(n node, name string, m axisMap, bandOf func(float64) int, s *SeriesRead) error {
	s.Kind = n.attr("data-kind")
	for _, f := range strings.Fields(n.attr("data-indexes")) {
		i, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("series %q data-indexes: %w", name, err)
		}
		s.Index = append(s.Index, i)
	}
	for _, f := range strings.Fields(n.attr("data-values")) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return fmt.Errorf("series %q data-values: %w", name, err)
		}
		s.Value = append(s.Value, v)
	}
	pts := strings.Fields(n.attr("points"))
	per := 1
	if s.Kind == "step" {
		per = 2 // a level's two ends
	}
	if len(pts) != per*len(s.Value) || len(s.Index) != len(s.Value) {
		return fmt.Errorf("series %q: %d points for %d values and %d indexes", name, len(pts), len(s.Value), len(s.Index))
	}
	for i := 0; i < len(pts); i += per {
		var xs, ys []float64
		for _, pt := range pts[i : i+per] {
			xs1, ys1, ok := strings.Cut(pt, ",")
			x, err1 := strconv.ParseFloat(xs1, 64)
			y, err2 := strconv.ParseFloat(ys1, 64)
			if !ok || err1 != nil || err2 != nil {
				return fmt.Errorf("series %q: point %q", name, pt)
			}
			xs, ys = append(xs, x), append(ys, y)
		}
		if per == 2 && ys[0] != ys[1] {
			return fmt.Errorf("series %q: a level from %v to %v is not level", name, ys[0], ys[1])
		}
		mid := xs[0]
		if per == 2 {
			mid = (xs[0] + xs[1]) / 2
		}
		s.DrawnIndex = append(s.DrawnIndex, bandOf(mid))
		s.Drawn = append(s.Drawn, m.value(ys[0]))
		s.Resolution = append(s.Resolution, m.resolution(ys[0]))
	}
	return nil
}

// Check compares a series read back with the values it should show, one
// per band (NaN: none): the values it carries must be exactly these, and
// the geometry must show each within its resolution.
func (s *SeriesRead) Check(want []float64) error {
	var idx []int
	var vals []float64
	for i, v := range want {
		if !math.IsNaN(v) {
			idx, vals = append(idx, i), append(vals, v)
		}
	}
	if len(s.Index) != len(idx) {
		return fmt.Errorf("%d values drawn, want %d", len(s.Index), len(idx))
	}
	for k := range idx {
		if s.Index[k] != idx[k] || s.Value[k] != vals[k] {
			return fmt.Errorf("value %d: band %d carries %v, want band %d %v", k, s.Index[k], s.Value[k], idx[k], vals[k])
		}
		if s.DrawnIndex[k] != idx[k] {
			return fmt.Errorf("band %d's value is drawn in band %d", idx[k], s.DrawnIndex[k])
		}
		if math.Abs(s.Drawn[k]-vals[k]) > s.Resolution[k]+1e-9*math.Abs(vals[k]) {
			return fmt.Errorf("band %d: drawn at %v, want %v (within %v)", idx[k], s.Drawn[k], vals[k], s.Resolution[k])
		}
	}
	return nil
}
