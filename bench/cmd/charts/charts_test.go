package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/svgplot"
)

const (
	dataFile       = "../../results/benchmarks.json"
	resultsDir     = "../../results"
	benchmarksFile = "../../README.md"
)

func mustLoad(t *testing.T) *Data {
	t.Helper()
	d, err := load(dataFile)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The committed charts are what the program draws from the committed
// figures now, and every chart in results/ is one of them.
func TestChartsUpToDate(t *testing.T) {
	var files []string
	for _, c := range charts(mustLoad(t)) {
		files = append(files, c.file)
		var b bytes.Buffer
		if err := c.chart.WriteSVG(&b); err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(filepath.Join(resultsDir, c.file))
		if err != nil || !bytes.Equal(committed, b.Bytes()) {
			t.Errorf("bench/results/%s is not what the figures draw now (%v): cd bench && go run ./cmd/charts", c.file, err)
		}
	}
	found, _ := filepath.Glob(filepath.Join(resultsDir, "*.svg"))
	for _, f := range found {
		if !slices.Contains(files, filepath.Base(f)) {
			t.Errorf("bench/results/%s is drawn by nothing", filepath.Base(f))
		}
	}
}

// Each chart, parsed as XML, carries the figures and draws them where
// its axes put them.
func TestChartsShowFigures(t *testing.T) {
	d := mustLoad(t)
	for _, c := range charts(d) {
		var b bytes.Buffer
		if err := c.chart.WriteSVG(&b); err != nil {
			t.Fatal(err)
		}
		pic, err := svgplot.Read(b.Bytes())
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		if len(pic.Panels) != len(c.chart.Panels) {
			t.Fatalf("%s: %d panels read back, %d drawn", c.file, len(pic.Panels), len(c.chart.Panels))
		}
		if !strings.Contains(pic.Title, "2026-") {
			t.Errorf("%s: the title %q does not say the day", c.file, pic.Title)
		}
		for i, p := range c.chart.Panels {
			for _, s := range p.Series {
				got := pic.Panels[i].Series[s.Name]
				if got == nil {
					t.Fatalf("%s panel %d: no series %q", c.file, i, s.Name)
				}
				if err := got.Check(s.Values); err != nil {
					t.Errorf("%s panel %d %q: %v", c.file, i, s.Name, err)
				}
			}
		}
	}
	// And the values are the figures: spot checks from each table.
	want := map[string]map[string][]float64{
		"redis.svg":    {"sluice": {68877, 160402, 234817, 251871}, "redis_rate": {61852, 63889, 65093, 56256}},
		"postgres.svg": {"onekey, synchronous_commit=off": {12279, 12520, 5441}},
		"memory.svg":   {"sluice": {42.3, 25.5, 35.2}},
		"envoy.svg":    {"reference server (own process)": {8387, 7963, 8887}},
	}
	for _, c := range charts(d) {
		for name, vals := range want[c.file] {
			for _, s := range c.chart.Panels[0].Series {
				if s.Name == name && !slices.Equal(s.Values, vals) {
					t.Errorf("%s %s: %v, want %v", c.file, name, s.Values, vals)
				}
			}
		}
	}
}

// table returns the cells of the rows of the bench/README.md table whose
// header line starts with header.
func table(t *testing.T, md, header string) (head []string, rows [][]string) {
	t.Helper()
	lines := strings.Split(md, "\n")
	split := func(line string) []string {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		return cells
	}
	for i, line := range lines {
		if !strings.HasPrefix(line, header) {
			continue
		}
		for _, row := range lines[i+2:] {
			if !strings.HasPrefix(row, "|") {
				break
			}
			rows = append(rows, split(row))
		}
		return split(line), rows
	}
	t.Fatalf("bench/README.md has no table headed %q", header)
	return nil, nil
}

// numberRE finds the numbers of a cell: "35,767/s, p50 1.61" is 35767 and
// 1.61 (a digit after a letter, as in p50, is part of a word).
var numberRE = regexp.MustCompile(`(?:^|[^\w.])(\d[\d,]*(?:\.\d+)?)`)

func numbers(t *testing.T, cell string) []float64 {
	t.Helper()
	var out []float64
	for _, m := range numberRE.FindAllStringSubmatch(cell, -1) {
		v, err := strconv.ParseFloat(strings.ReplaceAll(m[1], ",", ""), 64)
		if err != nil {
			t.Fatalf("%q: %v", cell, err)
		}
		out = append(out, v)
	}
	return out
}

// expectCells compares a table row with the figures: each cell's leading
// numbers, or its text.
func expectCells(t *testing.T, where string, row []string, want ...any) {
	t.Helper()
	if len(row) < len(want) {
		t.Errorf("%s: %d cells, want %d", where, len(row), len(want))
		return
	}
	for i, w := range want {
		switch w := w.(type) {
		case string:
			if row[i] != w {
				t.Errorf("%s cell %d: %q, want %q", where, i, row[i], w)
			}
		case []float64:
			got := numbers(t, row[i])
			if len(got) < len(w) || !slices.Equal(got[:len(w)], w) {
				t.Errorf("%s cell %d: %q, the figures say %v", where, i, row[i], w)
			}
		}
	}
}

// results/benchmarks.json holds the numbers of bench/README.md's tables,
// row for row.
func TestFiguresAreTheTables(t *testing.T) {
	d := mustLoad(t)
	b, err := os.ReadFile(benchmarksFile)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	one := func(v ...float64) []float64 { return v }

	_, rows := table(t, md, "| limiter | serial ns/op |")
	if len(rows) != len(d.Memory.Rows) {
		t.Fatalf("memory: %d rows in bench/README.md, %d in the figures", len(rows), len(d.Memory.Rows))
	}
	for i, r := range d.Memory.Rows {
		expectCells(t, "memory "+r.Limiter, rows[i], r.Limiter, one(r.SerialNs), one(r.ParallelNs), one(r.OnekeyNs), one(float64(r.Allocs)))
	}

	_, rows = table(t, md, "| limiter | g | checks/s |")
	if len(rows) != len(d.Redis.Rows) {
		t.Fatalf("redis: %d rows in bench/README.md, %d in the figures", len(rows), len(d.Redis.Rows))
	}
	for i, r := range d.Redis.Rows {
		expectCells(t, "redis "+r.Limiter, rows[i], r.Limiter, one(float64(r.Goroutines)), one(r.ChecksPerS), one(r.P50us, r.P99us), one(r.RedisCPUus), one(r.AdmittedPct))
	}

	head, rows := table(t, md, "| round | memory store |")
	setups := order(d.Envoy.Rows, func(r EnvoyRow) string { return r.Setup })
	if !slices.Equal(head[1:], setups) {
		t.Errorf("envoy: the table's setups %q, the figures' %q", head[1:], setups)
	}
	if len(rows)*len(setups) != len(d.Envoy.Rows) {
		t.Fatalf("envoy: %d rounds of %d setups in bench/README.md, %d figures", len(rows), len(setups), len(d.Envoy.Rows))
	}
	for _, r := range d.Envoy.Rows {
		row := rows[r.Round-1]
		expectCells(t, "envoy round "+row[0], []string{row[0], row[1+slices.Index(setups, r.Setup)]}, strconv.Itoa(r.Round), one(r.CallsPerS, r.P50ms, r.P99ms))
	}

	_, rows = table(t, md, "| workload | goroutines |")
	if 2*len(rows) != len(d.Postgres.Rows) {
		t.Fatalf("postgres: %d rows in bench/README.md (on and off), %d figures", len(rows), len(d.Postgres.Rows))
	}
	for _, r := range d.Postgres.Rows {
		k := slices.IndexFunc(rows, func(row []string) bool {
			return row[0] == r.Workload && row[1] == strconv.Itoa(r.Goroutines)
		})
		if k < 0 {
			t.Errorf("postgres: no row %s %d", r.Workload, r.Goroutines)
			continue
		}
		col := map[string]int{"on": 2, "off": 4}[r.SynchronousCommit]
		expectCells(t, "postgres "+r.Workload+" "+r.SynchronousCommit, rows[k][col:col+2], one(r.TakesPerS), one(r.P50us, r.P99us))
	}
	for _, s := range []struct{ name, date string }{{"memory", d.Memory.Date}, {"redis", d.Redis.Date}, {"envoy", d.Envoy.Date}, {"postgres", d.Postgres.Date}} {
		if !regexp.MustCompile(`^20\d\d-\d\d-\d\d$`).MatchString(s.date) {
			t.Errorf("%s: date %q, want YYYY-MM-DD", s.name, s.date)
		}
	}
}

// bench/README.md shows each chart above the table it draws, and says
// where the charts come from.
func TestBenchmarksShowsCharts(t *testing.T) {
	b, err := os.ReadFile(benchmarksFile)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for file, header := range map[string]string{
		"memory.svg":   "| limiter | serial ns/op |",
		"redis.svg":    "| limiter | g | checks/s |",
		"envoy.svg":    "| round | memory store |",
		"postgres.svg": "| workload | goroutines |",
	} {
		img := strings.Index(md, "](results/"+file+")")
		tbl := strings.Index(md, "\n"+header)
		if img < 0 || tbl < 0 || img > tbl {
			t.Errorf("bench/README.md does not show results/%s above its table", file)
			continue
		}
		if between := md[img:tbl]; strings.Contains(between, "\n|") {
			t.Errorf("another table stands between results/%s and its own", file)
		}
	}
	for _, want := range []string{"results/benchmarks.json", "go run ./cmd/charts"} {
		if !strings.Contains(md, want) {
			t.Errorf("bench/README.md does not mention %s", want)
		}
	}
}
