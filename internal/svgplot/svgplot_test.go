package svgplot

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"
)

func draw(t *testing.T, c *Chart) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := c.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Every kind of series, on linear and logarithmic axes and on a
// right-hand axis, reads back to its values, both those it carries and
// those its geometry shows.
func TestReadBack(t *testing.T) {
	nan := math.NaN()
	c := &Chart{
		Title: "t", Subtitle: []string{"s"},
		Panels: []Panel{
			{
				X: Bands{Label: "time", Names: []string{"0s", "1s", "2s", "3s"}, AtEdges: true},
				Y: Axis{Label: "requests"}, Y2: &Axis{Label: "seconds"},
				Series: []Series{
					{Name: "admitted", Kind: Bar, Stack: "r", Color: "#0a0", Values: []float64{19, 10, 1, 1}},
					{Name: "rejected", Kind: Bar, Stack: "r", Color: "#a00", Values: []float64{1, 10, 0, 0}},
					{Name: "offered", Kind: Step, Color: "#000", Values: []float64{20, 20, 1, 1}},
					{Name: "queued", Kind: Step, Right: true, Dash: true, Values: []float64{0.05, 1.05, 2, 2}},
				},
			},
			{
				X: Bands{Label: "goroutines", Names: []string{"1", "16", "64", "256"}},
				Y: Axis{Label: "p99 µs", Log: true},
				Series: []Series{
					{Name: "a", Class: "sluice", Kind: Line, Values: []float64{35, 493, 1501, 4719}},
					{Name: "b", Kind: Line, Values: []float64{nan, 721, 2637, 13804}},
					{Name: "c", Kind: Bar, Stack: "c", Values: []float64{3, nan, 300, 30000}},
					{Name: "d", Kind: Bar, Stack: "d", Values: []float64{7, 70, 700, 7000}},
				},
			},
		},
	}
	pic, err := Read(draw(t, c))
	if err != nil {
		t.Fatal(err)
	}
	if pic.Title != "t" || len(pic.Panels) != 2 || !reflect.DeepEqual(pic.Legend, []string{"admitted", "rejected", "offered", "queued", "sluice", "b", "c", "d"}) {
		t.Fatalf("title %q, %d panels, legend %v", pic.Title, len(pic.Panels), pic.Legend)
	}
	for i, p := range c.Panels {
		for _, s := range p.Series {
			got := pic.Panels[i].Series[s.class()]
			if got == nil {
				t.Fatalf("panel %d: no series %q", i, s.class())
			}
			if got.Kind != kindName(s.Kind) || (got.Axis == "y2") != s.Right {
				t.Errorf("panel %d %q: kind %s on %s", i, s.Name, got.Kind, got.Axis)
			}
			if err := got.Check(s.Values); err != nil {
				t.Errorf("panel %d %q: %v", i, s.Name, err)
			}
		}
	}
	// The check catches a wrong value.
	s := pic.Panels[0].Series["admitted"]
	if err := s.Check([]float64{19, 10, 2, 1}); err == nil {
		t.Error("Check accepted a wrong value")
	}
	s.Value[2] = 2
	if err := s.Check([]float64{19, 10, 2, 1}); err == nil || !strings.Contains(err.Error(), "drawn at") {
		t.Errorf("Check accepted a value its bar does not show: %v", err)
	}
}

// Text from the data (a key, a rule's name) cannot break out of its
// element: the SVG stays well-formed and says what it was given. A
// character XML cannot carry becomes U+FFFD.
func TestEscapes(t *testing.T) {
	evil := `</text><script>alert(1)</script>"' & ]]>` + "\x00\x1b"
	c := &Chart{
		Title: evil, Subtitle: []string{evil}, Desc: evil,
		Panels: []Panel{{
			Title: evil,
			X:     Bands{Label: evil, Names: []string{evil}},
			Y:     Axis{Label: evil},
			Series: []Series{
				{Name: evil, Kind: Bar, Values: []float64{1}},
				{Name: evil + "2", Class: evil + "3", Kind: Line, Values: []float64{1}},
			},
		}},
	}
	data := draw(t, c)
	if bytes.Contains(data, []byte("<script")) {
		t.Fatalf("an element from the data:\n%s", data)
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	var texts []string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, data)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "script" {
			t.Fatal("a script element")
		}
		if cd, ok := tok.(xml.CharData); ok {
			texts = append(texts, string(cd))
		}
	}
	want := strings.ReplaceAll(strings.ReplaceAll(evil, "\x00", "\uFFFD"), "\x1b", "\uFFFD")
	n := 0
	for _, s := range texts {
		if s == want {
			n++
		}
	}
	if n < 6 {
		t.Errorf("the text appears %d times as given, want every place (title, desc, subtitle, panel, axes, legend)", n)
	}
	if _, err := Read(data); err != nil {
		t.Fatal(err)
	}
}

func TestNiceTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   []float64
	}{
		{0, 20, []float64{0, 5, 10, 15, 20}},
		{0, 19, []float64{0, 5, 10, 15, 20}},
		{0, 1, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}},
		{0, 251871, []float64{0, 100000, 200000, 300000}},
		{0, 0.3, []float64{0, 0.1, 0.2, 0.3}},
		{-3, 7, []float64{-4, -2, 0, 2, 4, 6, 8}},
	} {
		if got := NiceTicks(tc.lo, tc.hi, 5); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("NiceTicks(%v, %v) = %v, want %v", tc.lo, tc.hi, got, tc.want)
		}
	}
	if got := niceTicks(0, 2, 5, 1); !reflect.DeepEqual(got, []float64{0, 1, 2}) {
		t.Errorf("whole ticks of 0..2: %v", got)
	}
	if got := niceTicks(0, 1, 5, 1); !reflect.DeepEqual(got, []float64{0, 1}) {
		t.Errorf("whole ticks of 0..1: %v", got)
	}
	if got := logTicks(35, 13804); !reflect.DeepEqual(got, []float64{10, 100, 1000, 10000, 100000}) {
		t.Errorf("logTicks = %v", got)
	}
}

func TestFormatValue(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 251871: "251,871", -1500: "-1,500", 0.25: "0.25", 1.05: "1.05", 100: "100"} {
		if got := FormatValue(v); got != want {
			t.Errorf("FormatValue(%v) = %q, want %q", v, got, want)
		}
	}
}

// Labels of many bands are thinned to round steps so they do not
// overlap: 1, 2 or 5 times a power of ten.
func TestEveryNth(t *testing.T) {
	for _, tc := range []struct {
		need, band float64
		want       int
	}{{30, 100, 1}, {30, 20, 2}, {30, 7, 5}, {30, 1, 50}, {30, 0.07, 500}} {
		if got := everyNth(tc.need, tc.band); got != tc.want {
			t.Errorf("everyNth(%v, %v) = %d, want %d", tc.need, tc.band, got, tc.want)
		}
	}
}

func TestWrap(t *testing.T) {
	got := wrap([]string{"a bb ccc dddd", "", "eeeeeeeeeeee f"}, 6)
	want := []string{"a bb", "ccc", "dddd", "", "eeeeeeeeeeee", "f"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("wrap: %q, want %q", got, want)
	}
}
