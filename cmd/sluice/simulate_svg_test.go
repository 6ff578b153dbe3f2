package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/svgplot"
)

// simulateSVG runs sluice simulate with args, --json - and --svg, and
// returns the series and the chart read back from the SVG as XML.
func simulateSVG(t *testing.T, args ...string) (*simSeries, *svgplot.Picture, []byte) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "sim.svg")
	var out, errb bytes.Buffer
	if code := run(append(append([]string{"simulate"}, args...), "--json", "-", "--svg", file), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var s simSeries
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pic, err := svgplot.Read(data)
	if err != nil {
		t.Fatalf("the SVG does not read back: %v\n%s", err, data)
	}
	return &s, pic, data
}

// checkSimChart compares every drawn series with the simulation's exact
// counts: the numbers each bar and line carries, and the values its
// geometry shows through the axes' ticks.
func checkSimChart(t *testing.T, s *simSeries, pic *svgplot.Picture) {
	t.Helper()
	if len(pic.Panels) != 2 {
		t.Fatalf("%d panels, want requests and the bucket", len(pic.Panels))
	}
	n := len(s.Steps)
	col := func(f func(simStep) float64) []float64 {
		v := make([]float64, n)
		for i, st := range s.Steps {
			v[i] = f(st)
		}
		return v
	}
	want := []map[string][]float64{{
		"offered":  col(func(st simStep) float64 { return float64(st.Offered) }),
		"admitted": col(func(st simStep) float64 { return float64(st.Admitted) }),
		"rejected": col(func(st simStep) float64 { return float64(st.Rejected) }),
	}, {
		"tokens_left": col(func(st simStep) float64 { return float64(st.Left) }),
	}}
	if s.Reserve {
		want[1]["queued_s"] = col(func(st simStep) float64 { return time.Duration(st.Queued).Seconds() })
	}
	for i, p := range pic.Panels {
		if p.Bands != n {
			t.Errorf("panel %d: %d bands for %d steps", i, p.Bands, n)
		}
		if len(p.Series) != len(want[i]) {
			t.Errorf("panel %d draws %d series, want %d", i, len(p.Series), len(want[i]))
		}
		for name, vals := range want[i] {
			got := p.Series[name]
			if got == nil {
				t.Errorf("panel %d: no series %s", i, name)
				continue
			}
			if err := got.Check(vals); err != nil {
				t.Errorf("panel %d, %s: %v", i, name, err)
			}
		}
	}
	var legend []string
	for _, p := range want {
		for name := range p {
			legend = append(legend, name)
		}
	}
	for _, name := range legend {
		if !strings.Contains(" "+strings.Join(pic.Legend, " ")+" ", " "+name+" ") {
			t.Errorf("the legend %v lacks %s", pic.Legend, name)
		}
	}
	if !strings.Contains(pic.Title, "limit "+s.Limit+", "+s.Description) {
		t.Errorf("title %q", pic.Title)
	}
}

// --svg draws the series the table, --csv and --json give: each bar and
// line carries the simulation's exact counts and is drawn at them, for a
// token bucket, a reserving one, a leaky bucket and a fixed window.
func TestSimulateSVG(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		reserve bool
	}{
		{[]string{"--limit", "api", "--pattern", "20/s for 2s, 1/s for 2s"}, false},
		{[]string{"--limit", "batch", "--pattern", "20/s for 4s, 5/s for 4s", "--step", "250ms"}, true},
		{[]string{"--limit", "webhooks", "--pattern", "20/s for 2s, 7/s for 1s", "--step", "100ms"}, true},
		{[]string{"--limit", "per-minute", "--pattern", "5/s for 3m", "--step", "10s"}, false},
	} {
		t.Run(tc.args[1], func(t *testing.T) {
			s, pic, data := simulateSVG(t, append([]string{"--config", "../../examples/api.yaml"}, tc.args...)...)
			if s.Reserve != tc.reserve {
				t.Fatalf("reserve %v, want %v", s.Reserve, tc.reserve)
			}
			checkSimChart(t, s, pic)
			if tc.args[1] == "api" {
				// The worked example of TestSimulateTokenBucket, drawn.
				for name, want := range map[string][]float64{"admitted": {19, 10, 1, 1}, "rejected": {1, 10, 0, 0}, "offered": {20, 20, 1, 1}} {
					if err := pic.Panels[0].Series[name].Check(want); err != nil {
						t.Errorf("%s: %v", name, err)
					}
				}
				if err := pic.Panels[1].Series["tokens_left"].Check([]float64{0, 0, 0, 9}); err != nil {
					t.Errorf("tokens left: %v", err)
				}
			}
			// Axis labels say the units.
			for _, label := range []string{"requests per ", "tokens left", "time since the start (one step: "} {
				if !bytes.Contains(data, []byte(`class="axis-label"`)) || !bytes.Contains(data, []byte(">"+label)) {
					t.Errorf("no axis labelled %q", label)
				}
			}
			if tc.reserve && !bytes.Contains(data, []byte(">longest queued wait (s)<")) {
				t.Error("no axis for the queued wait")
			}
		})
	}
	// Thousands of steps still draw every one.
	s, pic, _ := simulateSVG(t, "--config", "../../examples/api.yaml", "--limit", "api", "--pattern", "30/s for 10m, 2/s for 10m", "--step", "500ms")
	if len(s.Steps) != 2400 {
		t.Fatalf("%d steps", len(s.Steps))
	}
	checkSimChart(t, s, pic)
}

// --svg - draws on stdout instead of the table, and the same file named
// by two outputs is refused.
func TestSimulateSVGOutputs(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"simulate", "--config", "../../examples/api.yaml", "--limit", "api", "--pattern", "20/s for 2s", "--svg", "-"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !bytes.HasPrefix(out.Bytes(), []byte("<svg ")) || bytes.Contains(out.Bytes(), []byte("total: 40 offered, 29 admitted (72.5%), 11 rejected\n")) {
		t.Fatalf("--svg - printed:\n%s", out.String())
	}
	if err := xml.Unmarshal(out.Bytes(), new(struct{})); err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]string{{"--csv", "--svg"}, {"--json", "--svg"}} {
		errb.Reset()
		if code := run([]string{"simulate", "--pattern", "1/s for 1s", pair[0], "x", pair[1], "x"}, io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), pair[0]+" and "+pair[1]+" name the same file") {
			t.Errorf("%v: exit %d, %s", pair, code, errb.String())
		}
	}
}

// A key is text the operator typed, shown in the chart: markup in it
// stays text, and the SVG stays well-formed.
func TestSimulateSVGEscapesKey(t *testing.T) {
	key := `</text><script>alert("x")</script>&amp;`
	s, pic, data := simulateSVG(t, "--config", "../../examples/api.yaml", "--limit", "api", "--key", key, "--pattern", "20/s for 2s")
	if bytes.Contains(data, []byte("<script")) {
		t.Fatal("the key's markup became an element")
	}
	checkSimChart(t, s, pic)
	var doc struct {
		Texts []string `xml:"text"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(doc.Texts, "\n"), `key "</text><script>alert(\"x\")</script>&amp;"`) {
		t.Errorf("the subtitle does not show the key as typed: %q", doc.Texts)
	}
}

// docs/simulate.svg, which docs/getting-started.md shows, is what the
// command shown there draws
// now: regenerated and compared, so it cannot drift from the code.
// SLUICE_WRITE_DOCS=1 rewrites it.
func TestSimulateSVGDoc(t *testing.T) {
	const file = "docs/simulate.svg"
	readme, err := os.ReadFile(simulateDoc)
	if err != nil {
		t.Fatal(err)
	}
	var cmd string
	for _, line := range strings.Split(string(readme), "\n") {
		if c, ok := strings.CutPrefix(strings.TrimSpace(line), "sluice simulate "); ok && strings.HasSuffix(c, " --svg "+file) {
			cmd = strings.TrimSuffix(c, " --svg "+file)
		}
	}
	if cmd == "" {
		t.Fatalf("%s shows no command ending in --svg %s", simulateDoc, file)
	}
	if !strings.Contains(string(readme), "]("+strings.TrimPrefix(file, "docs/")+")") {
		t.Errorf("%s does not show %s", simulateDoc, file)
	}
	args := readmeArgs(cmd)
	got := filepath.Join(t.TempDir(), "simulate.svg")
	var errb bytes.Buffer
	if code := run(append(append([]string{"simulate"}, args...), "--svg", got), io.Discard, &errb); code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errb.String())
	}
	data, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("../..", file)
	if os.Getenv("SLUICE_WRITE_DOCS") == "1" {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	committed, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (SLUICE_WRITE_DOCS=1 go test -run TestSimulateSVGDoc ./cmd/sluice writes it)", err)
	}
	if !bytes.Equal(committed, data) {
		t.Fatalf("%s differs from what the command of docs/getting-started.md draws now: SLUICE_WRITE_DOCS=1 go test -run TestSimulateSVGDoc ./cmd/sluice rewrites it", file)
	}
	s, pic, _ := simulateSVG(t, args...)
	checkSimChart(t, s, pic)
}
