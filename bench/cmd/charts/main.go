// Command charts draws bench/README.md's measurements as SVG charts:
// throughput and p99 latency against the number of callers, sluice beside
// the other limiters, and a chart per door of sluice serve (each HTTP
// door against a bare handler, the Envoy service against the reference
// server). Each chart's subtitle names the machine, the pinning and the
// command, its title the day. It reads the figures from results/benchmarks.json,
// which holds the numbers of bench/README.md's tables (a test checks that
// they agree), and writes one SVG per table next to it:
//
//	cd bench && go run ./cmd/charts
//
// Nothing is measured here: the figures are measured by hand, as
// bench/README.md says, and copied into the JSON file with the tables.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/sluicehq/sluice/internal/svgplot"
)

// Data is results/benchmarks.json: one section per table of bench/README.md.
type Data struct {
	Memory   Section[MemoryRow]   `json:"memory"`
	Redis    Section[RedisRow]    `json:"redis"`
	Envoy    Section[EnvoyRow]    `json:"envoy"`
	Postgres Section[PostgresRow] `json:"postgres"`
	// Wrk is the wrk pairs of "Memory store and HTTP doors on AMD": one
	// chart per HTTP door.
	Wrk Section[WrkRow] `json:"wrk"`
	// EnvoyRedis is "Envoy rate limit service"'s rounds on Redis with
	// the server on a core of its own, sluice beside the reference server.
	EnvoyRedis Section[EnvoyRedisRow] `json:"envoy_redis"`
	// FrontDoors is "Front doors against their floors": each door of
	// sluice serve against a server that answers the same and decides
	// nothing.
	FrontDoors Section[FrontDoorRow] `json:"front_doors"`
}

// Section is one table's rows and where they were measured: the day, the
// machine, which cores ran what, and the command.
type Section[R any] struct {
	Date    string `json:"date"`
	Machine string `json:"machine"`
	Pinning string `json:"pinning"`
	Command string `json:"command"`
	Rows    []R    `json:"rows"`
}

// MemoryRow is a row of "Memory store": ns per check of each workload.
type MemoryRow struct {
	Limiter    string  `json:"limiter"`
	SerialNs   float64 `json:"serial_ns"`
	ParallelNs float64 `json:"parallel_ns"`
	OnekeyNs   float64 `json:"onekey_ns"`
	Allocs     int     `json:"allocs"`
}

// RedisRow is a row of "Redis store".
type RedisRow struct {
	Limiter     string  `json:"limiter"`
	Goroutines  int     `json:"goroutines"`
	ChecksPerS  float64 `json:"checks_per_s"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	RedisCPUus  float64 `json:"redis_cpu_us"`
	AdmittedPct float64 `json:"admitted_pct"`
}

// EnvoyRow is one cell of "Envoy rate limit service"'s table of rounds at
// 64 callers.
type EnvoyRow struct {
	Round     int     `json:"round"`
	Setup     string  `json:"setup"`
	CallsPerS float64 `json:"calls_per_s"`
	P50ms     float64 `json:"p50_ms"`
	P99ms     float64 `json:"p99_ms"`
}

// PostgresRow is one workload, goroutine count and synchronous_commit of
// "PostgreSQL store".
type PostgresRow struct {
	Workload          string  `json:"workload"`
	Goroutines        int     `json:"goroutines"`
	SynchronousCommit string  `json:"synchronous_commit"`
	TakesPerS         float64 `json:"takes_per_s"`
	P50us             float64 `json:"p50_us"`
	P99us             float64 `json:"p99_us"`
}

// WrkRow is one run of one door in the wrk pairs: sluice's requests per
// second over the bare handler's, the median pair and the extremes.
type WrkRow struct {
	Door   string  `json:"door"`
	Run    int     `json:"run"`
	Median float64 `json:"median"`
	Low    float64 `json:"low"`
	High   float64 `json:"high"`
}

// EnvoyRedisRow is one server in one round of the Envoy service on Redis.
type EnvoyRedisRow struct {
	Round       int     `json:"round"`
	Server      string  `json:"server"`
	CallsPerS   float64 `json:"calls_per_s"`
	P99ms       float64 `json:"p99_ms"`
	ServerCPUus float64 `json:"server_cpu_us"`
	RedisCPUus  float64 `json:"redis_cpu_us"`
}

// FrontDoorRow is one door against its floor: the floor's CPU per call,
// sluice's extra over it (the median over the runs and the runs' extremes)
// and the ratios of the runs.
type FrontDoorRow struct {
	Door           string  `json:"door"`
	FloorUsLow     float64 `json:"floor_us_low"`
	FloorUsHigh    float64 `json:"floor_us_high"`
	ExtraUs        float64 `json:"extra_us"`
	ExtraUsLow     float64 `json:"extra_us_low"`
	ExtraUsHigh    float64 `json:"extra_us_high"`
	CPURatioLow    float64 `json:"cpu_ratio_low"`
	CPURatioHigh   float64 `json:"cpu_ratio_high"`
	CallsRatioLow  float64 `json:"calls_ratio_low"`
	CallsRatioHigh float64 `json:"calls_ratio_high"`
}

func main() {
	data := flag.String("data", "results/benchmarks.json", "the figures")
	out := flag.String("out", "results", "the directory the charts are written to")
	flag.Parse()
	d, err := load(*data)
	if err != nil {
		fmt.Fprintln(os.Stderr, "charts:", err)
		os.Exit(1)
	}
	for _, c := range charts(d) {
		var b bytes.Buffer
		if err := c.chart.WriteSVG(&b); err != nil {
			fmt.Fprintln(os.Stderr, "charts:", c.file, err)
			os.Exit(1)
		}
		if err := os.WriteFile(filepath.Join(*out, c.file), b.Bytes(), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "charts:", err)
			os.Exit(1)
		}
	}
}

func load(path string) (*Data, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d Data
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &d, nil
}

// named is a chart and the file it is written to.
type named struct {
	file  string
	chart *svgplot.Chart
}

func charts(d *Data) []named {
	return []named{
		{"memory.svg", memoryChart(d.Memory)},
		{"redis.svg", redisChart(d.Redis)},
		{"envoy.svg", envoyChart(d.Envoy)},
		{"postgres.svg", postgresChart(d.Postgres)},
		{"door-auth.svg", wrkChart(d.Wrk, "auth", "HTTP forward auth (GET /v1/auth)", bareHandler)},
		{"door-take.svg", wrkChart(d.Wrk, "take", "Decision API (POST /v1/take)", bareHandler)},
		{"door-proxy.svg", wrkChart(d.Wrk, "proxy", "Reverse proxy (GET /v1/auth, proxied)", bareProxy)},
		{"door-envoy-redis.svg", envoyRedisChart(d.EnvoyRedis)},
		{"door-floors.svg", frontDoorsChart(d.FrontDoors)},
	}
}

// Colours: sluice blue (lighter for its variants), every other limiter a
// colour of its own.
var colors = map[string]string{
	"sluice":                 "#1565c0",
	"sluice-nocache":         "#42a5f5",
	"sluice-nobatch-nocache": "#90caf9",
	"sluice-take":            "#64b5f6",
	"xrate":                  "#8e24aa",
	"sethvargo":              "#ef6c00",
	"throttled":              "#6d4c41",
	"redis_rate":             "#c62828",
	"sluice serve":           "#1565c0",
	"reference server":       "#2e7d32",
	"lowest pair":            "#90caf9",
	"median pair":            "#1565c0",
	"highest pair":           "#0d47a1",
	"lowest run":             "#90caf9",
	"median over the runs":   "#1565c0",
	"highest run":            "#0d47a1",
	"cpu ratio, lowest run":  "#a5d6a7",
	"cpu ratio, highest run": "#2e7d32",
	"calls/s ratio, lowest":  "#ffcc80",
	"calls/s ratio, highest": "#ef6c00",
}

var palette = []string{"#1565c0", "#42a5f5", "#2e7d32", "#81c784", "#0d47a1", "#c62828", "#6d4c41", "#ef6c00"}

func color(name string, i int) string {
	if c, ok := colors[name]; ok {
		return c
	}
	return palette[i%len(palette)]
}

// title names the table, the day it was measured and what the chart
// shows; subtitle says on what machine, and how.
func title[R any](what string, s Section[R], shows string) string {
	return what + ", " + s.Date + ": " + shows
}

func subtitle[R any](s Section[R]) []string {
	return []string{"measured on " + s.Machine, "pinning: " + s.Pinning, s.Command}
}

// order returns the distinct keys of rows in their first order.
func order[R any](rows []R, key func(R) string) []string {
	var out []string
	for _, r := range rows {
		if k := key(r); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// grid lays rows out as one value per series and band (NaN where a table
// has no such row).
func grid[R any](rows []R, series, bands []string, seriesOf, bandOf func(R) string, value func(R) float64) map[string][]float64 {
	out := map[string][]float64{}
	for _, s := range series {
		v := make([]float64, len(bands))
		for i := range v {
			v[i] = math.NaN()
		}
		out[s] = v
	}
	for _, r := range rows {
		out[seriesOf(r)][slices.Index(bands, bandOf(r))] = value(r)
	}
	return out
}

func memoryChart(s Section[MemoryRow]) *svgplot.Chart {
	bands := []string{"serial", "parallel", "onekey"}
	var series []svgplot.Series
	for i, r := range s.Rows {
		series = append(series, svgplot.Series{Name: r.Limiter, Kind: svgplot.Bar, Stack: r.Limiter, Color: color(r.Limiter, i),
			Values: []float64{r.SerialNs, r.ParallelNs, r.OnekeyNs}})
	}
	return &svgplot.Chart{
		Title:    title("Memory store", s, "ns per check, sluice beside three Go limiters"),
		Subtitle: subtitle(s),
		Desc:     "Nanoseconds per check of each in-memory limiter on 10,000 Zipf-skewed keys: serial (one goroutine), parallel (2 goroutines) and onekey (one goroutine, one key); medians of 6 runs; sluice asked through Limiter.Allow, sluice-take through Limiter.Take (the whole Decision).",
		Panels: []svgplot.Panel{{
			X:      svgplot.Bands{Label: "workload: serial (1 goroutine, 10,000 keys), parallel (2 goroutines), onekey (1 goroutine, 1 key)", Names: bands},
			Y:      svgplot.Axis{Label: "ns per check (lower is better)"},
			Series: series,
		}},
	}
}

// callersCharts is a chart of throughput and p99 against callers, one
// line per series.
func callersChart(title, desc string, sub []string, xLabel string, bands, names []string, throughput, p99 map[string][]float64, tpLabel, p99Label string) *svgplot.Chart {
	var tp, lat []svgplot.Series
	for i, n := range names {
		tp = append(tp, svgplot.Series{Name: n, Kind: svgplot.Line, Color: color(n, i), Values: throughput[n]})
		lat = append(lat, svgplot.Series{Name: n, Kind: svgplot.Line, Color: color(n, i), Values: p99[n]})
	}
	return &svgplot.Chart{
		Title: title, Subtitle: sub, Desc: desc,
		Panels: []svgplot.Panel{
			{Title: "throughput (higher is better)", X: svgplot.Bands{Label: xLabel, Names: bands}, Y: svgplot.Axis{Label: tpLabel}, Series: tp},
			{Title: "p99 latency (lower is better)", X: svgplot.Bands{Label: xLabel, Names: bands}, Y: svgplot.Axis{Label: p99Label, Log: true}, Series: lat},
		},
	}
}

func redisChart(s Section[RedisRow]) *svgplot.Chart {
	g := func(r RedisRow) string { return strconv.Itoa(r.Goroutines) }
	l := func(r RedisRow) string { return r.Limiter }
	bands, names := order(s.Rows, g), order(s.Rows, l)
	return callersChart(
		title("Redis store", s, "throughput and p99 against goroutines"),
		"Checks per second and p99 latency of each Redis-backed limiter at 1, 16, 64 and 256 goroutines, against one local redis-server; 100,000 checks per point.",
		subtitle(s), "goroutines calling at once", bands, names,
		grid(s.Rows, names, bands, l, g, func(r RedisRow) float64 { return r.ChecksPerS }),
		grid(s.Rows, names, bands, l, g, func(r RedisRow) float64 { return r.P99us }),
		"checks per second", "p99 latency (µs, log scale)")
}

func postgresChart(s Section[PostgresRow]) *svgplot.Chart {
	g := func(r PostgresRow) string { return strconv.Itoa(r.Goroutines) }
	l := func(r PostgresRow) string { return r.Workload + ", synchronous_commit=" + r.SynchronousCommit }
	bands, names := order(s.Rows, g), order(s.Rows, l)
	return callersChart(
		title("PostgreSQL store", s, "throughput and p99 against goroutines"),
		"Takes per second and p99 latency of the PostgreSQL store at 1, 16 and 64 goroutines, on 10,000 Zipf-skewed keys and on one hot key, with synchronous_commit on and off.",
		subtitle(s), "goroutines calling at once", bands, names,
		grid(s.Rows, names, bands, l, g, func(r PostgresRow) float64 { return r.TakesPerS }),
		grid(s.Rows, names, bands, l, g, func(r PostgresRow) float64 { return r.P99us }),
		"takes per second", "p99 latency (µs, log scale)")
}

func envoyChart(s Section[EnvoyRow]) *svgplot.Chart {
	bands, tp, lat := roundBars(s.Rows, func(r EnvoyRow) (int, string) { return r.Round, r.Setup },
		func(r EnvoyRow) float64 { return r.CallsPerS }, func(r EnvoyRow) float64 { return r.P99ms })
	x := svgplot.Bands{Label: "round (each runs every setup in turn), 64 callers", Names: bands}
	return &svgplot.Chart{
		Title:    title("Envoy service", s, "64 callers, sluice beside the reference server"),
		Subtitle: subtitle(s),
		Desc:     "Calls per second and p99 latency of ShouldRateLimit at 64 callers in three rounds: sluice's service in the load tool's process on the memory and redis stores, gRPC alone, sluice serve and envoyproxy/ratelimit each as a process of its own on the same Redis and reference-format file.",
		Panels: []svgplot.Panel{
			{Title: "throughput (higher is better)", X: x, Y: svgplot.Axis{Label: "calls per second"}, Series: tp},
			{Title: "p99 latency (lower is better)", X: x, Y: svgplot.Axis{Label: "p99 latency (ms)"}, Series: lat},
		},
	}
}

// The floors of the HTTP doors' wrk pairs: what sluice's door is compared
// with, deciding nothing.
const (
	bareHandler = "a bare net/http handler"
	bareProxy   = "a bare Go reverse proxy"
)

// wrkChart is one HTTP door's wrk pairs: sluice's requests per second over
// its floor's in each run, the median pair beside the lowest and the
// highest.
func wrkChart(s Section[WrkRow], door, name, floor string) *svgplot.Chart {
	var runs []string
	var low, median, high []float64
	for _, r := range s.Rows {
		if r.Door != door {
			continue
		}
		runs = append(runs, "run "+strconv.Itoa(r.Run))
		low, median, high = append(low, r.Low), append(median, r.Median), append(high, r.High)
	}
	var series []svgplot.Series
	for i, v := range []struct {
		name   string
		values []float64
	}{{"lowest pair", low}, {"median pair", median}, {"highest pair", high}} {
		series = append(series, svgplot.Series{Name: v.name, Kind: svgplot.Bar, Stack: v.name, Color: color(v.name, i), Values: v.values})
	}
	return &svgplot.Chart{
		Title:    title(name, s, "sluice's requests per second over "+floor+"'s, by wrk"),
		Subtitle: subtitle(s),
		Desc:     "The ratio of sluice serve's requests per second to " + floor + "'s on the " + name + " door, measured by wrk in alternating pairs: per run, the median pair, the lowest and the highest.",
		Panels: []svgplot.Panel{{
			X:      svgplot.Bands{Label: "run of 10 alternating pairs of 4 s", Names: runs},
			Y:      svgplot.Axis{Label: "sluice / floor (higher is better)"},
			Series: series,
		}},
	}
}

// roundBars is the bands (one per round) and, for two figures of each
// row, a bar series per setup: rounds that run every setup in turn.
func roundBars[R any](rows []R, of func(R) (round int, setup string), a, b func(R) float64) (bands []string, as, bs []svgplot.Series) {
	r := func(x R) string { n, _ := of(x); return "round " + strconv.Itoa(n) }
	l := func(x R) string { _, s := of(x); return s }
	bands, names := order(rows, r), order(rows, l)
	ga, gb := grid(rows, names, bands, l, r, a), grid(rows, names, bands, l, r, b)
	for i, n := range names {
		as = append(as, svgplot.Series{Name: n, Kind: svgplot.Bar, Stack: n, Color: color(n, i), Values: ga[n]})
		bs = append(bs, svgplot.Series{Name: n, Kind: svgplot.Bar, Stack: n, Color: color(n, i), Values: gb[n]})
	}
	return bands, as, bs
}

// envoyRedisChart is the Envoy service on Redis in rounds: the server's
// CPU per call and the calls per second, sluice serve beside the reference
// server.
func envoyRedisChart(s Section[EnvoyRedisRow]) *svgplot.Chart {
	bands, cs, tp := roundBars(s.Rows, func(r EnvoyRedisRow) (int, string) { return r.Round, r.Server },
		func(r EnvoyRedisRow) float64 { return r.ServerCPUus }, func(r EnvoyRedisRow) float64 { return r.CallsPerS })
	x := svgplot.Bands{Label: "round (each runs both servers in turn), 64 callers", Names: bands}
	return &svgplot.Chart{
		Title:    title("Envoy service on Redis", s, "sluice serve beside envoyproxy/ratelimit"),
		Subtitle: subtitle(s),
		Desc:     "The server's CPU time per ShouldRateLimit call and the calls per second at 64 callers, in five rounds, of sluice serve and of envoyproxy/ratelimit, each a process of its own on the same Redis and reference-format file.",
		Panels: []svgplot.Panel{
			{Title: "server CPU per call (lower is better)", X: x, Y: svgplot.Axis{Label: "server CPU µs per call"}, Series: cs},
			{Title: "throughput (higher is better)", X: x, Y: svgplot.Axis{Label: "calls per second"}, Series: tp},
		},
	}
}

// frontDoorsChart is each door against its floor: sluice's extra CPU per
// call, the floor's CPU per call over sluice's (cpu ratio) and sluice's
// calls per second over the floor's (calls/s ratio), the runs' extremes.
func frontDoorsChart(s Section[FrontDoorRow]) *svgplot.Chart {
	var doors []string
	cols := map[string][]float64{}
	names := []string{"lowest run", "median over the runs", "highest run",
		"cpu ratio, lowest run", "cpu ratio, highest run", "calls/s ratio, lowest", "calls/s ratio, highest"}
	for _, r := range s.Rows {
		doors = append(doors, r.Door)
		for i, v := range []float64{r.ExtraUsLow, r.ExtraUs, r.ExtraUsHigh, r.CPURatioLow, r.CPURatioHigh, r.CallsRatioLow, r.CallsRatioHigh} {
			cols[names[i]] = append(cols[names[i]], v)
		}
	}
	bars := func(names []string) []svgplot.Series {
		var out []svgplot.Series
		for i, n := range names {
			out = append(out, svgplot.Series{Name: n, Kind: svgplot.Bar, Stack: n, Color: color(n, i), Values: cols[n]})
		}
		return out
	}
	x := svgplot.Bands{Label: "door: forward auth (GET /v1/auth), decision API (POST /v1/take), Envoy service (gRPC)", Names: doors}
	return &svgplot.Chart{
		Title:    title("Front doors against their floors", s, "what sluice's own work costs per call"),
		Subtitle: subtitle(s),
		Desc:     "Each door of sluice serve on the memory store against a server that answers the same and decides nothing (a bare net/http handler, a no-op Envoy rate limit service), in six runs of 20 alternating pairs on fresh servers: sluice's extra CPU per call over the floor's (the median over the runs, the lowest and the highest run), the floor's CPU per call over sluice's (cpu ratio) and sluice's calls per second over the floor's (calls/s ratio), the lowest and the highest run.",
		Panels: []svgplot.Panel{
			{Title: "sluice's extra CPU per call over the floor (lower is better)", X: x, Y: svgplot.Axis{Label: "extra CPU µs per call"}, Series: bars(names[:3])},
			{Title: "cpu ratio (floor's CPU/call over sluice's), calls/s ratio (sluice's over floor's)", X: x, Y: svgplot.Axis{Label: "ratio (higher is better)"}, Series: bars(names[3:])},
		},
	}
}
