package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
)

// simulateRows runs sluice simulate and returns its table rows as fields:
// from, offered, admitted, rejected, tokens left, queued, bar.
func simulateRows(t *testing.T, args ...string) ([][]string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(append([]string{"simulate"}, args...), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rows [][]string
	in := false
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == "from":
			in = true
		case len(f) == 0:
			in = false
		case in:
			rows = append(rows, f)
		}
	}
	return rows, out.String()
}

// wantRows compares the first len(want[i]) fields of each row.
func wantRows(t *testing.T, rows [][]string, out string, want ...string) {
	t.Helper()
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d:\n%s", len(rows), len(want), out)
	}
	for i, w := range want {
		n := len(strings.Fields(w))
		if got := strings.Join(rows[i][:min(n, len(rows[i]))], " "); got != w {
			t.Fatalf("row %d: %q, want %q\n%s", i, got, w, out)
		}
	}
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestSimulateTokenBucket(t *testing.T) {
	cfg := writeConfig(t, "rules:\n  - name: api\n    algorithm: token_bucket\n    algorithm_config: {rps: 10, burst: 10}\n  - name: other\n    algorithm_config: {rps: 1, burst: 1}\n")
	// 20 requests a second, one every 50ms, against 10 tokens refilled at
	// 10/s: the burst and the refill admit the first 19 (the 19th, at
	// 0.9s, takes the last whole token), then every other one.
	rows, out := simulateRows(t, "--config", cfg, "--limit", "api", "--pattern", "20/s for 2s, 1/s for 2s")
	wantRows(t, rows, out,
		"0s 20 19 1 0 -",
		"1s 20 10 10 0 -",
		"2s 1 1 0 0 -", // the half token left at 1.95s, and 0.5 more
		"3s 1 1 0 9 -", // full again, less 1
	)
	for _, want := range []string{
		"limit api: token bucket of 10, refilling 10/s",
		"the bucket starts full; each request asks 1 token; one line per 1s",
		"from   offered  admitted  rejected  tokens left  queued  # admitted . rejected (full bar: 20 requests)",
		"total: 42 offered, 31 admitted (73.8%), 11 rejected\n",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	// The clock is simulated: the same answer every run.
	if _, again := simulateRows(t, "--config", cfg, "--limit", "api", "--pattern", "20/s for 2s, 1/s for 2s"); again != out {
		t.Fatalf("a second run differs:\n%s\n%s", out, again)
	}
}

// A fixed window's simulated clock starts on one of the key's window
// boundaries, whether the limit fixes them (start) or spreads them by key,
// so each window is counted whole: 100 of each minute's 300 requests.
func TestSimulateFixedWindowBoundary(t *testing.T) {
	spread := writeConfig(t, "rules:\n  - name: spread\n    algorithm: fixed_window\n    algorithm_config: {rate: 100, period: 1m}\n")
	for _, args := range [][]string{
		{"--config", "../../examples/api.yaml", "--limit", "per-minute"},
		{"--config", spread},
		{"--config", spread, "--key", "another key"},
	} {
		rows, out := simulateRows(t, append(args, "--pattern", "5/s for 3m", "--step", "30s")...)
		wantRows(t, rows, out,
			"0s 150 100 50 0",
			"30s 150 0 150 0",
			"1m 150 100 50 0",
			"1m30s 150 0 150 0",
			"2m 150 100 50 0",
			"2m30s 150 0 150 0",
		)
		if !strings.Contains(out, "fixed window of 100 per 1m\nthe clock starts at a window boundary of key") {
			t.Fatalf("header:\n%s", out)
		}
	}
}

func TestSimulateReferenceFile(t *testing.T) {
	// 600 a minute, asked 1,200 times in a minute that starts on a window
	// boundary: the first half minute takes the window's 600.
	rows, out := simulateRows(t, "--config", "../../examples/ratelimit-config.yaml", "--limit", "envoy.edge.remote_address.b8139932fb309819", "--pattern", "20/s for 60s", "--step", "30s")
	wantRows(t, rows, out, "0s 600 600 0 0", "30s 600 0 600 0")
	if !strings.Contains(out, "limit envoy.edge.remote_address.b8139932fb309819: fixed window of 600 per 1m") {
		t.Fatalf("summary:\n%s", out)
	}
	// The file's own name for the limit is the same limit, as on /v1/take.
	rows, out = simulateRows(t, "--config", "../../examples/ratelimit-config.yaml", "--limit", "per-address", "--pattern", "20/s for 60s", "--step", "30s")
	wantRows(t, rows, out, "0s 600 600 0 0", "30s 600 0 600 0")
	if !strings.Contains(out, "limit envoy.edge.remote_address.b8139932fb309819: fixed window of 600 per 1m") {
		t.Fatalf("summary:\n%s", out)
	}
	var errb bytes.Buffer
	if code := run([]string{"simulate", "--config", "../../examples/ratelimit-config.yaml", "--limit", "per-adress", "--pattern", "1/s for 1s"}, io.Discard, &errb); code != 2 ||
		!strings.Contains(errb.String(), `unknown rule "per-adress" (did you mean "per-address"?); the limits are: envoy.edge.remote_address.b8139932fb309819 (per-address), envoy.edge.client_id.5e4498c45d97a14d (search-per-client)`) {
		t.Errorf("per-adress: exit %d, %s", code, errb.String())
	}
}

// A rule with reserve: true reserves in simulate as it does in serve.
//
// batch in examples/api.yaml: 10 tokens, refilled at 10/s, up to 20 in
// debt. Request k (k = 0..79) comes at k/20 s, when the bucket has
// received 0.5k tokens, so after it the bucket holds 10 + 0.5k - (k+1) =
// 9 - 0.5k: negative from k = 19, and its turn comes (9 - 0.5k)/-10 s
// later. That is at least -20 up to k = 58 (at 2.9s, wait 2s): the first
// 59 are admitted. From then on a request finds -19.5 and would leave
// -20.5, so it is rejected (k = 59, 61, ... 79: 11), and the next, 50ms
// later, finds -19 and is admitted (k = 60, 62, ... 78: 10). Per second:
// 20 (longest wait k = 19: 0.05s), 20 (k = 39: 1.05s), 19 and 1 (k = 58:
// 2s), 10 and 10 (2s): 69 of 80. Without the reservation the bucket
// would admit 19 + 10 + 10 + 10 = 49. Tokens left shows the debt, rounded
// down: after k = 19, 9 - 9.5 = -0.5 (-1); after k = 39, -10.5 (-11);
// k = 59 and k = 79 are rejected and find -19.5 (-20).
func TestSimulateReservation(t *testing.T) {
	rows, out := simulateRows(t, "--config", "../../examples/api.yaml", "--limit", "batch", "--pattern", "20/s for 4s")
	wantRows(t, rows, out,
		"0s 20 20 0 -1 50ms",
		"1s 20 20 0 -11 1.05s",
		"2s 20 19 1 -20 2s",
		"3s 20 10 10 -20 2s",
	)
	if !strings.Contains(out, "requests reserve, up to 20 tokens in debt") || !strings.Contains(out, "total: 80 offered, 69 admitted (86.2%), 11 rejected; the longest queued 2s") {
		t.Fatalf("summary:\n%s", out)
	}
}

// A leaky bucket reserves every request: each admitted one waits for its
// slot, and the column shows how long.
//
// webhooks in examples/api.yaml: one slot per 100ms, a wait of at most
// 1s. Request k comes at k*50ms and gets the slot at k*100ms, a wait of
// k*50ms: k = 0..20 are admitted (the 20th waits 1s), then one of every
// two (the other would wait 1.05s): 20 + 10 of 40. The bucket of 1 has
// received 0.5k tokens by request k: after k = 19 it holds 1 + 9.5 - 20 =
// -9.5 (-10 whole); k = 39 is rejected and finds 1 + 19.5 - 30 = -9.5.
func TestSimulateLeakyBucket(t *testing.T) {
	rows, out := simulateRows(t, "--config", "../../examples/api.yaml", "--limit", "webhooks", "--pattern", "20/s for 2s")
	wantRows(t, rows, out, "0s 20 20 0 -10 950ms", "1s 20 10 10 -10 1s")
	if !strings.Contains(out, "limit webhooks: leaky bucket of 1, draining 10/s") {
		t.Fatalf("summary:\n%s", out)
	}
}

// A served rule that reserves without max_reserved owes at most its
// capacity: each admitted request is told its turn, until the debt would
// pass the capacity.
//
// A bucket of 2 refilled at 1/s; request k comes at k/4 s, when 0.25k has
// arrived, and would leave 2 + 0.25k - (k+1) = 1 - 0.75k: k = 3 leaves
// -1.25 (turn in 1.25s), k = 4 leaves -2 (2s), k = 5..7 would leave
// -2.75, -2.5, -2.25, beyond the bound of 2, and are refused.
func TestSimulateReservationDefaultBound(t *testing.T) {
	cfg := writeConfig(t, "rules:\n  - name: open\n    algorithm_config: {rps: 1, burst: 2, reserve: true}\n")
	rows, out := simulateRows(t, "--config", cfg, "--pattern", "4/s for 2s")
	wantRows(t, rows, out, "0s 4 4 0 -2 1.25s", "1s 4 1 3 -2 2s")
	if !strings.Contains(out, "requests reserve, up to 2 tokens in debt") || !strings.Contains(out, "5 admitted (62.5%), 3 rejected; the longest queued 2s") {
		t.Fatalf("summary:\n%s", out)
	}
}

// A fixed window reserves: a cost above its capacity goes into debt that
// the next window pays, and max_reserved bounds it.
//
// 10 a minute from the hour, reserve up to 10 in debt, 16 tokens a
// minute. At 0: 10 - 16 = -6, paid by the window at 1m (a wait of 1m). At
// 1m: -6 + 10 = 4, and 16 would leave 12 in debt: rejected, until the
// window at 2m. At 2m: 4 + 10 = 14, capped at 10, and 16 leaves -6 again.
func TestSimulateFixedWindowReservation(t *testing.T) {
	cfg := writeConfig(t, "rules:\n  - name: fw\n    algorithm: fixed_window\n    algorithm_config: {rate: 10, period: 1m, start: 0s, reserve: true, max_reserved: 10}\n")
	rows, out := simulateRows(t, "--config", cfg, "--pattern", "1/m for 3m", "--step", "1m", "--cost", "16")
	wantRows(t, rows, out, "0s 1 1 0 -6 1m", "1m 1 0 1 4 -", "2m 1 1 0 -6 1m")
	if !strings.Contains(out, "requests reserve, up to 10 tokens in debt") {
		t.Fatalf("summary:\n%s", out)
	}
}

// A bucket of capacity 0 spaces requests exactly 1/rate apart: request k
// at k*50ms leaves -(0.5k + 1) and its turn is at 100ms*(k+1).
func TestSimulateCapacityZero(t *testing.T) {
	cfg := writeConfig(t, "rules:\n  - name: spaced\n    algorithm_config: {rate: 10, period: 1s, capacity: 0, reserve: true, max_reserved: 100}\n")
	rows, out := simulateRows(t, "--config", cfg, "--pattern", "20/s for 1s")
	wantRows(t, rows, out, "0s 20 20 0 -11 1.05s")
	if !strings.Contains(out, "token bucket of 0, refilling 10/s") {
		t.Fatalf("summary:\n%s", out)
	}
}

// A request asks what the rule charges one that declares no cost, unless
// --cost says otherwise.
func TestSimulateCost(t *testing.T) {
	cfg := writeConfig(t, "rules:\n  - name: heavy\n    algorithm_config: {rps: 1, burst: 10, cost_source: fixed, fixed_cost: 5}\n")
	rows, out := simulateRows(t, "--config", cfg, "--pattern", "4/s for 1s")
	wantRows(t, rows, out, "0s 4 2 2 0")
	if !strings.Contains(out, "each request asks 5 tokens") {
		t.Fatalf("header:\n%s", out)
	}
	rows, out = simulateRows(t, "--config", cfg, "--pattern", "4/s for 1s", "--cost", "1")
	wantRows(t, rows, out, "0s 4 4 0 6")
}

// --csv and --json write the series the table prints, and read back to
// the same numbers.
func TestSimulateExport(t *testing.T) {
	dir := t.TempDir()
	csvPath, jsonPath := filepath.Join(dir, "s.csv"), filepath.Join(dir, "s.json")
	rows, out := simulateRows(t, "--config", "../../examples/api.yaml", "--limit", "batch", "--pattern", "20/s for 4s, 2/s for 1s",
		"--csv", csvPath, "--json", jsonPath)

	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var s simSeries
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	if s.Limit != "batch" || !s.Reserve || s.Cost != 1 || s.Capacity != 10 || time.Duration(s.Step) != time.Second || !s.Start.Equal(simEpoch) || len(s.Steps) != 5 {
		t.Fatalf("JSON series: %+v", s)
	}
	if s.Steps[1].Queued != seconds(1050*time.Millisecond) || s.Steps[4].From != seconds(4*time.Second) {
		t.Fatalf("JSON steps: %+v", s.Steps)
	}
	// The JSON is the series itself: encoding it again gives the file.
	var again bytes.Buffer
	if err := writeSimJSON(&again, &s); err != nil || again.String() != string(data) {
		t.Fatalf("JSON round trip (%v):\n%s\n%s", err, data, again.String())
	}
	// Each table row is the JSON step's numbers.
	for i, r := range rows {
		st := s.Steps[i]
		got := strings.Join(r[:6], " ")
		want := strings.Join([]string{shortDuration(time.Duration(st.From)), strconv.Itoa(st.Offered), strconv.Itoa(st.Admitted), strconv.Itoa(st.Rejected), strconv.FormatInt(st.Left, 10), queued(st.Queued)}, " ")
		if got != want {
			t.Fatalf("table row %d %q, JSON step %q\n%s", i, got, want, out)
		}
	}

	f, err := os.Open(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	// The CSV's header is the JSON steps' field names, in order.
	var names []string
	for i := range reflect.TypeOf(simStep{}).NumField() {
		names = append(names, reflect.TypeOf(simStep{}).Field(i).Tag.Get("json"))
	}
	if !reflect.DeepEqual(recs[0], names) || len(recs) != len(s.Steps)+1 {
		t.Fatalf("CSV header %v, want %v; %d records", recs[0], names, len(recs))
	}
	for i, rec := range recs[1:] {
		var st simStep
		num := func(k int) int64 {
			n, err := strconv.ParseInt(rec[k], 10, 64)
			if err != nil {
				t.Fatalf("CSV line %d: %v", i+2, err)
			}
			return n
		}
		from, err1 := parseSeconds(rec[0])
		q, err2 := parseSeconds(rec[5])
		if err1 != nil || err2 != nil {
			t.Fatalf("CSV line %d: %v %v", i+2, err1, err2)
		}
		st = simStep{From: from, Offered: int(num(1)), Admitted: int(num(2)), Rejected: int(num(3)), Left: num(4), Queued: q}
		if st != s.Steps[i] {
			t.Fatalf("CSV line %d: %+v, JSON %+v", i+2, st, s.Steps[i])
		}
	}

	// "-" writes the series to stdout in place of the table.
	var o, e bytes.Buffer
	if code := run([]string{"simulate", "--config", "../../examples/api.yaml", "--limit", "batch", "--pattern", "20/s for 4s, 2/s for 1s", "--json", "-"}, &o, &e); code != 0 || o.String() != string(data) {
		t.Fatalf("--json -: exit %d %s\n%s", code, e.String(), o.String())
	}
}

func TestSimulateBadInput(t *testing.T) {
	cfg := writeConfig(t, "rules:\n  - name: a\n    algorithm_config: {rps: 1, burst: 1}\n  - name: b\n    algorithm_config: {rps: 1, burst: 1}\n")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--pattern", "20/s for 1s, 10 per s"}, 2, `segment 2 "10 per s"`},
		{[]string{"--pattern", "20/d for 1s"}, 2, `"N/s", "N/m" or "N/h"`},
		{[]string{"--pattern", "-1/s for 1s"}, 2, "finite number >= 0"},
		{[]string{"--pattern", "NaN/s for 1s"}, 2, "finite number >= 0"},
		{[]string{"--pattern", "1/s for -1s"}, 2, "duration must be positive"},
		{[]string{"--pattern", "20/s for 2s 1/s for 2s"}, 2, `segment 1 "20/s for 2s 1/s for 2s": a comma is missing between two segments: "20/s for 2s, 1/s for 2s"`},
		{[]string{"--pattern", "20/s for 2"}, 2, `segment 1 "20/s for 2": the duration "2" has no unit: write 2s (or ms, m, h)`},
		{[]string{"--pattern", "20/s for soon"}, 2, `"soon" is not a duration`},
		{[]string{"--pattern", "20/s for 2"}, 2, `--pattern takes segments of "RATE/s for DURATION" separated by commas`},
		{[]string{"--pattern", ""}, 2, "empty"},
		{[]string{"--pattern", "1e9/s for 1h"}, 2, "at most 10000000"},
		{[]string{"--pattern", "1/s for 24h", "--step", "1s"}, 2, "use a longer --step"},
		{[]string{"--pattern", "1/s for 1s", "--cost", "NaN"}, 2, "--cost must be"},
		{[]string{"--pattern", "1/s for 1s", "--cost", "100"}, 2, "a cost of 100"},
		{[]string{"--pattern", "1/s for 1s", "--csv", "x", "--json", "x"}, 2, "name the same file"},
		{[]string{"--pattern", "1/s for 1s", "--csv", filepath.Join(t.TempDir(), "no", "such", "dir.csv")}, 1, "write "},
		{[]string{"--config", cfg, "--pattern", "1/s for 1s"}, 2, "name one with --limit (a, b)"},
		{[]string{"--config", cfg, "--limit", "c", "--pattern", "1/s for 1s"}, 2, `unknown rule "c"; the limits are: a, b`},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"simulate"}, tc.args...), &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}

// A concurrency limit counts requests in flight, which arrivals alone do
// not say: simulate refuses it, by name or as the policy's only limit.
func TestSimulateRefusesConcurrency(t *testing.T) {
	cfg := writeConfig(t, "rules:\n  - name: cc\n    algorithm: concurrency\n    algorithm_config: {max_in_flight: 2}\n")
	for _, args := range [][]string{{"--config", cfg}, {"--config", cfg, "--limit", "cc"}} {
		var out, errb bytes.Buffer
		args = append(args, "--pattern", "1/s for 1s")
		if code := run(append([]string{"simulate"}, args...), &out, &errb); code != 2 || !strings.Contains(errb.String(), `limit "cc" is a concurrency limit: simulate replays arrivals`) {
			t.Errorf("%v: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

// The simulate examples of docs/getting-started.md print what the
// command prints.
func TestSimulateDocExamples(t *testing.T) {
	data, err := os.ReadFile(simulateDoc)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	n := 0
	for i := 0; i < len(lines); i++ {
		cmd, ok := strings.CutPrefix(lines[i], "    $ sluice simulate ")
		if !ok {
			continue
		}
		// The output is the indented lines (and blank ones) that follow.
		var want []string
		for i++; i < len(lines) && (lines[i] == "" || strings.HasPrefix(lines[i], "    ")) && !strings.HasPrefix(lines[i], "    $ "); i++ {
			want = append(want, strings.TrimPrefix(lines[i], "    "))
		}
		i--
		args := append([]string{"simulate"}, readmeArgs(cmd)...)
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		if got, w := strings.TrimSpace(out.String()), strings.TrimSpace(strings.Join(want, "\n")); got != w {
			t.Errorf("%s shows for %v:\n%s\nthe command prints:\n%s", simulateDoc, args, w, got)
		}
		n++
	}
	if n < 2 {
		t.Fatalf("found %d simulate examples in %s, want 2", n, simulateDoc)
	}
}

// simulateDoc is the page that shows sluice simulate.
const simulateDoc = "../../docs/getting-started.md"

// readmeArgs splits a command line as the docs write it: words, and
// "quoted" arguments; a file under examples/ is found from this directory.
func readmeArgs(cmd string) []string {
	var args []string
	for j, f := range strings.Split(cmd, `"`) {
		if j%2 == 1 {
			args = append(args, f)
		} else {
			args = append(args, strings.Fields(f)...)
		}
	}
	for k, a := range args {
		if strings.HasPrefix(a, "examples/") {
			args[k] = "../../" + a
		}
	}
	return args
}

// simulate admits what serve admits and reports the waits serve holds
// requests for: the same requests at the same instants through the HTTP
// gate that serve runs (its Delay recording instead of waiting) give the
// same series, for a plain bucket, a reserving one, a leaky bucket and a
// fixed window.
func TestSimulateAgreesWithServe(t *testing.T) {
	_, p, err := loadPolicy("../../examples/api.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ limit, path, pattern, step string }{
		{"api", "/api/x", "20/s for 2s, 1/s for 2s", "1s"},
		{"batch", "/batch/x", "20/s for 4s, 3/s for 2s", "1s"},
		{"webhooks", "/hooks/x", "20/s for 2s, 7/s for 1s", "500ms"},
		{"per-minute", "/x", "5/s for 3m", "30s"},
	} {
		t.Run(tc.limit, func(t *testing.T) {
			// The key each rule of examples/api.yaml builds for the request
			// below. per-minute applies to every path, but its 100 a minute
			// never binds the others' patterns (fewer than 100 requests).
			key := map[string]string{"api": "k1", "batch": "k1", "webhooks": "example.com", "per-minute": "192.0.2.1"}[tc.limit]
			var o, e bytes.Buffer
			if code := run([]string{"simulate", "--config", "../../examples/api.yaml", "--limit", tc.limit, "--key", key, "--pattern", tc.pattern, "--step", tc.step, "--json", "-"}, &o, &e); code != 0 {
				t.Fatalf("exit %d: %s", code, e.String())
			}
			var sim simSeries
			if err := json.Unmarshal(o.Bytes(), &sim); err != nil {
				t.Fatal(err)
			}

			clock := sluice.NewManualClock(sim.Start)
			var waited time.Duration
			gate := httpgate.New(p, sluice.New(memory.New(memory.Options{Clock: clock, PreciseClock: true})), httpgate.Options{
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Delay:  func(_ context.Context, d time.Duration) error { waited = d; return nil },
			})
			h := gate.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			segs, err := parsePattern(tc.pattern)
			if err != nil {
				t.Fatal(err)
			}
			step := time.Duration(sim.Step)
			served := make([]simStep, len(sim.Steps))
			var at time.Duration
			for _, s := range segs {
				for k := range int(math.Floor(s.rate * s.d.Seconds())) {
					t := at + time.Duration(math.Round(float64(k)*float64(time.Second)/s.rate))
					clock.Set(sim.Start.Add(t))
					req := httptest.NewRequest("GET", "http://example.com"+tc.path, nil)
					req.RemoteAddr = "192.0.2.1:1234"
					req.Header.Set("X-Api-Key", "k1")
					w := httptest.NewRecorder()
					waited = 0
					h.ServeHTTP(w, req)
					r := &served[min(int(t/step), len(served)-1)]
					r.Offered++
					if w.Code == http.StatusOK {
						r.Admitted++
						r.Queued = max(r.Queued, seconds(waited))
					} else {
						r.Rejected++
					}
				}
				at += s.d
			}
			for i := range served {
				served[i].From, served[i].Left = sim.Steps[i].From, sim.Steps[i].Left
				if served[i] != sim.Steps[i] {
					t.Errorf("step %d: serve %+v, simulate %+v", i, served[i], sim.Steps[i])
				}
			}
		})
	}
}

// A sharded limit is simulated as serve decides it, from a fixed seed:
// the same answer every run, never above the unsharded bound.
func TestSimulateShards(t *testing.T) {
	cfg := writeConfig(t, "rules:\n  - name: hot\n    algorithm_config: {rps: 10, burst: 20, shards: 4}\n")
	rows, out := simulateRows(t, "--config", cfg, "--pattern", "30/s for 3s")
	if !strings.Contains(out, "limit hot: token bucket of 20, refilling 10/s, in 4 shards of which each request reads two\n") {
		t.Fatalf("no description of the shards in:\n%s", out)
	}
	admitted := 0
	for _, r := range rows {
		n, err := strconv.Atoi(r[2])
		if err != nil {
			t.Fatal(err)
		}
		admitted += n
	}
	if admitted > 20+10*3 || admitted < 30 {
		t.Fatalf("%d admitted in 3s of 20 + 10/s:\n%s", admitted, out)
	}
	if _, again := simulateRows(t, "--config", cfg, "--pattern", "30/s for 3s"); again != out {
		t.Fatalf("a second run differs:\n%s\n%s", out, again)
	}
}

// A sliding window admits its capacity in the first window, then, with
// the previous window's count weighing on the next, about half of it per
// half window at a steady offer; a calendar day in Berlin starts the
// simulated clock at local midnight and admits its capacity once.
func TestSimulateSlidingAndCalendarWindows(t *testing.T) {
	sw := writeConfig(t, "rules:\n  - name: smooth\n    algorithm: sliding_window\n    algorithm_config: {rate: 100, period: 1m}\n")
	rows, out := simulateRows(t, "--config", sw, "--pattern", "5/s for 2m", "--step", "30s")
	wantRows(t, rows, out, "0s 150 100 50 0", "30s 150 0 150 0", "1m 150 49 101 0", "1m30s 150 50 100 0")
	if !strings.Contains(out, "sliding window of 100 per 1m") {
		t.Fatalf("header:\n%s", out)
	}
	day := writeConfig(t, "rules:\n  - name: daily\n    algorithm: fixed_window\n    algorithm_config: {rate: 1000, period: day, timezone: Europe/Berlin}\n")
	rows, out = simulateRows(t, "--config", day, "--pattern", "1/s for 1h", "--step", "30m")
	wantRows(t, rows, out, "0s 1800 1000 800 0", "30m 1800 0 1800 0")
	if !strings.Contains(out, "fixed window of 1000 per calendar day (Europe/Berlin)") {
		t.Fatalf("header:\n%s", out)
	}
}
