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
		"redis.svg":       {"sluice": {68877, 160402, 234817, 251871}, "redis_rate": {61852, 63889, 65093, 56256}},
		"postgres.svg":    {"onekey, synchronous_commit=off": {12279, 12520, 5441}},
		"memory.svg":      {"sluice": {94.85, 72.05, 62.99}},
		"envoy.svg":       {"reference server (own process)": {8387, 7963, 8887}},
		"door-auth.svg":   {"median pair": {0.919, 0.885, 0.943, 0.886}, "lowest pair": {0.845, 0.790, 0.905, 0.779}},
		"door-take.svg":   {"median pair": {0.863, 0.850, 0.911, 0.880}, "highest pair": {1.009, 0.955, 0.943, 0.960}},
		"door-floors.svg": {"median over the runs": {0.68, 0.62, 2.40}, "highest run": {0.82, 1.11, 2.66}},
		"door-envoy-redis.svg": {"sluice serve": {14.81, 14.37, 14.83, 14.84, 14.76},
			"reference server": {39.01, 37.36, 34.74, 37.43, 34.61}},
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
	_, rows = table(t, md, "| door | run | sluice's requests/s over the floor's")
	if len(rows) != len(d.Wrk.Rows) {
		t.Fatalf("wrk: %d rows in bench/README.md, %d in the figures", len(rows), len(d.Wrk.Rows))
	}
	for i, r := range d.Wrk.Rows {
		if !strings.Contains(rows[i][0], "/v1/"+r.Door+"`") && !(r.Door == "proxy" && strings.HasPrefix(rows[i][0], "reverse proxy")) {
			t.Errorf("wrk row %d: door %q, the figures' %q", i, rows[i][0], r.Door)
		}
		expectCells(t, "wrk "+r.Door, rows[i][1:], strconv.Itoa(r.Run), one(r.Median, r.Low, r.High))
	}

	_, rows = table(t, md, "| round | server | calls/s |")
	if len(rows) != len(d.EnvoyRedis.Rows) {
		t.Fatalf("envoy on redis: %d rows in bench/README.md, %d in the figures", len(rows), len(d.EnvoyRedis.Rows))
	}
	for i, r := range d.EnvoyRedis.Rows {
		expectCells(t, "envoy on redis "+r.Server, rows[i], strconv.Itoa(r.Round), r.Server, one(r.CallsPerS), one(r.P99ms), one(r.ServerCPUus), one(r.RedisCPUus))
	}

	_, rows = table(t, md, "| door | floor CPU µs/call |")
	if len(rows) != len(d.FrontDoors.Rows) {
		t.Fatalf("front doors: %d rows in bench/README.md, %d in the figures", len(rows), len(d.FrontDoors.Rows))
	}
	for i, r := range d.FrontDoors.Rows {
		expectCells(t, "front doors "+r.Door, rows[i], r.Door, one(r.FloorUsLow, r.FloorUsHigh), one(r.ExtraUs, r.ExtraUsLow, r.ExtraUsHigh),
			one(r.CPURatioLow, r.CPURatioHigh), one(r.CallsRatioLow, r.CallsRatioHigh))
	}

	for _, s := range []struct{ name, date, machine, pinning, command string }{
		{"memory", d.Memory.Date, d.Memory.Machine, d.Memory.Pinning, d.Memory.Command},
		{"redis", d.Redis.Date, d.Redis.Machine, d.Redis.Pinning, d.Redis.Command},
		{"envoy", d.Envoy.Date, d.Envoy.Machine, d.Envoy.Pinning, d.Envoy.Command},
		{"postgres", d.Postgres.Date, d.Postgres.Machine, d.Postgres.Pinning, d.Postgres.Command},
		{"wrk", d.Wrk.Date, d.Wrk.Machine, d.Wrk.Pinning, d.Wrk.Command},
		{"envoy_redis", d.EnvoyRedis.Date, d.EnvoyRedis.Machine, d.EnvoyRedis.Pinning, d.EnvoyRedis.Command},
		{"front_doors", d.FrontDoors.Date, d.FrontDoors.Machine, d.FrontDoors.Pinning, d.FrontDoors.Command},
	} {
		if !regexp.MustCompile(`^20\d\d-\d\d-\d\d$`).MatchString(s.date) {
			t.Errorf("%s: date %q, want YYYY-MM-DD", s.name, s.date)
		}
		if s.machine == "" || s.pinning == "" || s.command == "" {
			t.Errorf("%s: the machine, the pinning or the command is missing", s.name)
		}
	}
}

// bench/README.md shows each chart above the table it draws, captioned
// by the table's machine, pinning and day, and says where the charts come
// from.
func TestBenchmarksShowsCharts(t *testing.T) {
	b, err := os.ReadFile(benchmarksFile)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for file, header := range map[string]string{
		"memory.svg":           "| limiter | serial ns/op |",
		"redis.svg":            "| limiter | g | checks/s |",
		"envoy.svg":            "| round | memory store |",
		"postgres.svg":         "| workload | goroutines |",
		"door-auth.svg":        "| door | run | sluice's requests/s",
		"door-take.svg":        "| door | run | sluice's requests/s",
		"door-proxy.svg":       "| door | run | sluice's requests/s",
		"door-envoy-redis.svg": "| round | server | calls/s |",
		"door-floors.svg":      "| door | floor CPU µs/call |",
	} {
		tbl := strings.Index(md, "\n"+header)
		img := -1
		if tbl >= 0 {
			img = strings.LastIndex(md[:tbl], "](results/"+file+")")
		}
		if img < 0 || !strings.HasPrefix(md[strings.LastIndex(md[:img], "\n")+1:], "![") {
			t.Errorf("bench/README.md does not show results/%s above its table", file)
			continue
		}
		between := md[img:tbl]
		if strings.Contains(between, "\n|") {
			t.Errorf("another table stands between results/%s and its own", file)
		}
		if !strings.Contains(between, "\nMachine: ") {
			t.Errorf("results/%s has no caption naming the machine, the pinning and the day between it and its table", file)
		}
	}
	for _, want := range []string{"results/benchmarks.json", "go run ./cmd/charts"} {
		if !strings.Contains(md, want) {
			t.Errorf("bench/README.md does not mention %s", want)
		}
	}
}

// whereAndHow is the paragraph right above every table of the benchmark
// pages: the machine, which cores ran what, the day and the commands.
var whereAndHow = regexp.MustCompile(`^Machine: (.+?); pinning: (.+?); day: (.+?); commands: (.+)$`)

// Every table of bench/README.md and of the root's benchmark page says
// in the paragraph right above it on what machine (processor and cores),
// with which cores running what, on what day and by what commands its
// figures were measured: a fact nobody wrote down is "not recorded".
func TestEveryTableSaysWhereAndHow(t *testing.T) {
	day := regexp.MustCompile(`20\d\d-\d\d-\d\d`)
	machine := regexp.MustCompile(`\d+-core (Intel|AMD)`)
	for _, file := range []string{benchmarksFile, "../../../BENCHMARKS.md"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		heading := 0
		for i, line := range lines {
			if strings.HasPrefix(line, "#") {
				heading = i
			}
			if !strings.HasPrefix(line, "|") || (i > 0 && strings.HasPrefix(lines[i-1], "|")) {
				continue
			}
			where := map[string]string{benchmarksFile: "bench/README.md"}[file]
			if where == "" {
				where = "BENCHMARKS.md"
			}
			where += ":" + strconv.Itoa(i+1)
			end := i - 1
			for end >= 0 && strings.TrimSpace(lines[end]) == "" {
				end--
			}
			start := end
			for start > 0 && strings.TrimSpace(lines[start-1]) != "" {
				start--
			}
			para := strings.Join(lines[start:end+1], " ")
			m := whereAndHow.FindStringSubmatch(para)
			if m == nil {
				t.Errorf("%s: the paragraph above the table is not \"Machine: ...; pinning: ...; day: ...; commands: ...\": %q", where, para)
				continue
			}
			head := strings.ToLower(line)
			column := func(v, name string) bool { return strings.Contains(v, "column") && strings.Contains(head, name) }
			if !machine.MatchString(m[1]) && !strings.Contains(m[1], "not recorded") {
				t.Errorf("%s: machine %q names no processor and cores", where, m[1])
			}
			if strings.TrimSpace(m[2]) == "" {
				t.Errorf("%s: no pinning", where)
			}
			if !day.MatchString(m[3]) && !strings.Contains(m[3], "not recorded") && !column(m[3], "day") {
				t.Errorf("%s: day %q is no date", where, m[3])
			}
			code := false
			for _, l := range lines[heading:i] {
				code = code || (strings.HasPrefix(l, "    ") && strings.TrimSpace(l) != "")
			}
			cmd := m[4]
			if !strings.Contains(cmd, "`") && !strings.Contains(cmd, "not recorded") && !column(cmd, "command") &&
				!column(cmd, "benchmark") && !(strings.Contains(cmd, "above") && code) {
				t.Errorf("%s: commands %q: neither quoted, nor a column of the table, nor a command block above it in its section", where, cmd)
			}
		}
	}
}
