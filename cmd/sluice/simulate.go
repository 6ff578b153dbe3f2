package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

func init() {
	commands["simulate"] = command{"replay a traffic pattern against one limit on a simulated clock and draw what it admits", runSimulate}
}

// Bounds on a simulation, so that a typo cannot run for hours or print a
// book.
const (
	maxSimRequests = 10_000_000
	maxSimSteps    = 10_000
	simBarWidth    = 50
)

// segment is one part of a traffic pattern: rate requests per second,
// evenly spaced, for d.
type segment struct {
	rate float64
	d    time.Duration
}

// runSimulate replays a pattern against one limit of a policy on the
// memory store and a simulated clock: no waiting, and the same answer
// every run. Each request goes through policy.LimitMatch and
// policy.Enforce, as serve's do, so a rule that reserves reserves here.
func runSimulate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("simulate", "usage: sluice simulate [--config FILE] [--limit NAME] --pattern \"50/s for 2s, 5/s for 10s\" [--step 1s] [--cost N] [--csv FILE] [--json FILE] [--svg FILE]\n\nReplays the pattern against the limit on the memory store with a simulated\nclock (the answer does not depend on the machine) and prints, per step, the\nrequests offered, admitted and rejected, the whole tokens left, and the\nlongest wait of a request admitted on reservation (reserve: true, leaky\nbuckets), which serve would hold that long. The bar shows admitted (#) and\nrejected (.) requests. A fixed window's clock starts at one of the key's\nwindow boundaries. --csv and --json write the same series to a file (\"-\"\nfor stdout); --svg draws it as a chart.", stderr)
	config := fs.String("config", "", "policy file (YAML or JSON); default: the embedded per-IP policy")
	limitName := fs.String("limit", "", `the limit to drive: a rule's name, or "RULE.TIER" (default: the policy's only limit)`)
	pattern := fs.String("pattern", "", "the traffic: "+patternSyntax)
	step := fs.Duration("step", time.Second, "the interval of each printed line")
	cost := fs.Float64("cost", 1, "tokens each request asks; when not given, what the rule charges a request that declares no cost")
	key := fs.String("key", "simulated", "the bucket's key")
	csvFile := fs.String("csv", "", `write the series as CSV to this file ("-": stdout, instead of the table)`)
	jsonFile := fs.String("json", "", `write the series as JSON to this file ("-": stdout, instead of the table)`)
	svgFile := fs.String("svg", "", `draw the series as an SVG chart in this file ("-": stdout, instead of the table)`)
	if code, ok := parseFlags(fs, args, false); !ok {
		return code
	}
	// exit says why simulate stops, and returns its exit code.
	exit := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice simulate: "+format+"\n", a...)
		return code
	}
	costGiven := false
	fs.Visit(func(f *flag.Flag) { costGiven = costGiven || f.Name == "cost" })
	segs, err := parsePattern(*pattern)
	if err != nil {
		return exit(2, "--pattern: %v\n--pattern takes %s", err, patternSyntax)
	}
	if *step <= 0 {
		return exit(2, "--step must be positive")
	}
	if math.IsNaN(*cost) || math.IsInf(*cost, 0) || *cost <= 0 {
		return exit(2, "--cost must be a finite number > 0, got %v", *cost)
	}
	for _, pair := range [][2]string{{"csv", "json"}, {"csv", "svg"}, {"json", "svg"}} {
		a, b := fs.Lookup(pair[0]).Value.String(), fs.Lookup(pair[1]).Value.String()
		if a != "" && a == b {
			return exit(2, "--%s and --%s name the same file", pair[0], pair[1])
		}
	}
	var total time.Duration
	var requests float64
	for _, s := range segs {
		total += s.d
		requests += math.Floor(s.rate * s.d.Seconds())
	}
	if requests > maxSimRequests {
		return exit(2, "the pattern makes %.0f requests, at most %d", requests, maxSimRequests)
	}
	steps := int((total + *step - 1) / *step)
	if steps > maxSimSteps {
		return exit(2, "%v in steps of %v is %d lines, at most %d: use a longer --step", total, *step, steps, maxSimSteps)
	}

	p := policy.Default()
	if *config != "" {
		if _, p, err = loadPolicy(*config); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	lim, err := pickLimit(p, *limitName)
	if err != nil {
		return exit(2, "%v", err)
	}
	m, ok := p.LimitMatch(lim.Name(), *key)
	if !ok {
		// A limit of a file in the reference server's format: its
		// requests are plain takes of one token.
		m = policy.Match{Request: sluice.Request{Limit: lim, Key: *key, Cost: 1}}
	}
	if costGiven {
		m.Request.Cost = *cost
	}
	// The rule every store applies: a reservation may cost up to the
	// capacity plus max_reserved.
	if err := m.Judge(); err != nil {
		return exit(2, "a cost of %v: %v", m.Request.Cost, err)
	}
	series, err := simulate(m, segs, *step)
	if err != nil {
		return exit(1, "%v", err)
	}
	table := true
	for _, out := range []struct {
		file  string
		write func(io.Writer, *simSeries) error
	}{{*csvFile, writeSimCSV}, {*jsonFile, writeSimJSON}, {*svgFile, func(w io.Writer, s *simSeries) error { return writeSimSVG(w, s, *pattern) }}} {
		if out.file == "" {
			continue
		}
		if out.file == "-" {
			table = false
		}
		if err := writeOutput(out.file, stdout, func(w io.Writer) error { return out.write(w, series) }); err != nil {
			return exit(1, "%v", err)
		}
	}
	if table {
		printSimulation(stdout, series)
	}
	return 0
}

// simSeries is a simulation's result, one simStep per line. The table,
// the CSV and the JSON are each written from it alone, so they cannot
// disagree; the JSON is this struct as it is.
type simSeries struct {
	Limit       string `json:"limit"`
	Description string `json:"description"` // describeLimit's
	Key         string `json:"key"`
	// Cost is what each request asks.
	Cost float64 `json:"cost"`
	// Capacity is the limit's burst, window or log size in tokens.
	Capacity float64 `json:"capacity"`
	// Reserve is set when admitted requests may wait their turn
	// (reserve: true, or a leaky bucket).
	Reserve bool `json:"reserve"`
	// MaxReserved is how far into debt a reservation may go, in tokens:
	// null when requests do not reserve, or reserve without bound.
	MaxReserved *float64 `json:"max_reserved"`
	// Shadow is set for a shadow-mode rule: the counts say what enforcing
	// it would do.
	Shadow bool `json:"shadow"`
	// Start is the simulated clock's first instant: a window boundary of
	// the key for a fixed window.
	Start time.Time `json:"start"`
	Step  seconds   `json:"step_s"`
	Steps []simStep `json:"steps"`
}

// simStep is one step of a simulation.
type simStep struct {
	From     seconds `json:"from_s"` // since Start
	Offered  int     `json:"offered"`
	Admitted int     `json:"admitted"`
	Rejected int     `json:"rejected"`
	// Left is the whole tokens left after the step's last request,
	// rounded down: negative while reservations hold the bucket in debt.
	Left int64 `json:"tokens_left"`
	// Queued is the longest wait of a request admitted on reservation in
	// the step: serve holds such a request that long before passing it on.
	Queued seconds `json:"queued_s"`
}

// simColumns are the CSV's columns: the JSON names of simStep's fields, in
// the same order.
var simColumns = []struct {
	name  string
	value func(*simStep) string
}{
	{"from_s", func(s *simStep) string { return s.From.String() }},
	{"offered", func(s *simStep) string { return strconv.Itoa(s.Offered) }},
	{"admitted", func(s *simStep) string { return strconv.Itoa(s.Admitted) }},
	{"rejected", func(s *simStep) string { return strconv.Itoa(s.Rejected) }},
	{"tokens_left", func(s *simStep) string { return strconv.FormatInt(s.Left, 10) }},
	{"queued_s", func(s *simStep) string { return s.Queued.String() }},
}

// seconds is a duration that the exports write as a number of seconds.
type seconds time.Duration

func (s seconds) String() string { return strconv.FormatFloat(time.Duration(s).Seconds(), 'f', -1, 64) }

func (s seconds) MarshalJSON() ([]byte, error) { return []byte(s.String()), nil }

func (s *seconds) UnmarshalJSON(b []byte) error {
	v, err := parseSeconds(string(b))
	*s = v
	return err
}

func parseSeconds(str string) (seconds, error) {
	f, err := strconv.ParseFloat(str, 64)
	if err != nil || math.IsNaN(f) || math.Abs(f) > math.MaxInt64/1e9 {
		return 0, fmt.Errorf("%q is not a number of seconds", str)
	}
	return seconds(math.Round(f * 1e9)), nil
}

// simEpoch is where a simulated clock starts, or the first window boundary
// after it: midnight, so that a minute's or an hour's steps line up with
// the clock's.
var simEpoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// simStart returns the simulated clock's first instant for key: the first
// boundary of its windows at or after simEpoch for a fixed window (where
// the key's first window starts, as the stores compute it), simEpoch
// otherwise.
func simStart(lim *sluice.Limit, key string) time.Time {
	p := lim.Params()
	if p.Calendar != 0 {
		// The first calendar boundary in the limit's zone at or after it.
		epoch := simEpoch.UnixMicro()
		b := engine.Windows(p, epoch)
		if b[1] == epoch {
			return simEpoch
		}
		return time.UnixMicro(b[2]).UTC()
	}
	if p.Algorithm != engine.FixedWindow {
		return simEpoch
	}
	offset := p.Offset
	if offset < 0 {
		offset = engine.WindowOffset(key, p.Period)
	}
	epoch := simEpoch.UnixMicro()
	into := (epoch - offset) % p.Period
	if into < 0 {
		into += p.Period
	}
	if into == 0 {
		return simEpoch
	}
	return time.UnixMicro(epoch - into + p.Period).UTC()
}

// simulate drives m's limit with the pattern on a fresh memory store whose
// clock only moves to each request's time. Each request is decided by
// policy.Enforce, as serve decides it.
func simulate(m policy.Match, segs []segment, step time.Duration) (*simSeries, error) {
	lim := m.Request.Limit
	start := simStart(lim, m.Request.Key)
	clock := sluice.NewManualClock(start)
	// A sharded limit picks shards at random: from a fixed seed, so that
	// every run gives the same answer.
	l := sluice.New(memory.New(memory.Options{Clock: clock, PreciseClock: true})).WithShardSeed(1)
	ms := []policy.Match{m}
	decide := func(op engine.Op) (sluice.Decision, error) {
		r := policy.Enforce(context.Background(), l, ms, policy.Options{Op: op}).Results[0]
		return r.Decision, r.StoreErr
	}
	var total time.Duration
	for _, s := range segs {
		total += s.d
	}
	series := &simSeries{
		Limit: lim.Name(), Description: describeLimit(lim), Key: m.Request.Key, Cost: m.Request.Cost,
		Capacity: lim.Capacity(), Reserve: m.Request.Reserve || lim.Params().Reserve,
		Shadow: m.Rule != nil && m.Rule.Mode == policy.Shadow,
		Start:  start, Step: seconds(step),
		Steps: make([]simStep, int((total+step-1)/step)),
	}
	if series.Reserve && (lim.Spec().MaxReserved > 0 || lim.Algorithm() == sluice.LeakyBucket) {
		mr := engine.FromMicroTokens(lim.Params().MaxReserved)
		series.MaxReserved = &mr
	}
	rows := series.Steps
	// A request the limit can never admit is an error before any is made.
	if _, err := decide(engine.OpPeek); err != nil {
		return nil, err
	}
	seen := make([]bool, len(rows))
	var at time.Duration // start of the segment
	for _, s := range segs {
		n := int(math.Floor(s.rate * s.d.Seconds()))
		for k := range n {
			// Rounded, not truncated, so that a rate whose spacing is a
			// whole number of microseconds lands on them exactly.
			t := at + time.Duration(math.Round(float64(k)*float64(time.Second)/s.rate))
			clock.Set(start.Add(t))
			d, err := decide(engine.OpTake)
			if err != nil {
				return nil, err
			}
			i := min(int(t/step), len(rows)-1)
			r := &rows[i]
			r.Offered++
			if d.Allowed {
				r.Admitted++
				r.Queued = max(r.Queued, seconds(d.RetryAfter))
			} else {
				r.Rejected++
			}
			r.Left, seen[i] = wholeTokens(d.Tokens), true
		}
		at += s.d
	}
	// A step without requests shows the tokens as the last request left
	// them; before any request the bucket is full.
	remaining := wholeTokens(lim.Capacity())
	for i := range rows {
		rows[i].From = seconds(time.Duration(i) * step)
		if !seen[i] {
			rows[i].Left = remaining
		}
		remaining = rows[i].Left
	}
	return series, nil
}

// wholeTokens rounds an exact token count down to whole tokens: 2.5 is 2,
// and a debt of 0.5 is -1, so that a bucket in debt never reads as empty.
func wholeTokens(tokens float64) int64 {
	// The tokens are whole micro-tokens: round away the float's error first.
	return int64(math.Floor(math.Round(tokens*engine.TokenScale) / engine.TokenScale))
}

// totals sums the steps; Queued is the longest wait of all.
func (s *simSeries) totals() simStep {
	var t simStep
	for _, r := range s.Steps {
		t.Offered += r.Offered
		t.Admitted += r.Admitted
		t.Rejected += r.Rejected
		t.Queued = max(t.Queued, r.Queued)
	}
	return t
}

// printSimulation writes the series as a table with a bar per step.
func printSimulation(w io.Writer, s *simSeries) {
	most := 1
	for _, r := range s.Steps {
		most = max(most, r.Offered)
	}
	step := time.Duration(s.Step)
	fmt.Fprintf(w, "limit %s: %s\n", s.Limit, s.Description)
	if s.Shadow {
		fmt.Fprintln(w, "shadow mode: serve admits every request; the counts say what enforcing would do")
	}
	switch {
	case strings.HasPrefix(s.Description, "fixed window"):
		fmt.Fprintf(w, "the clock starts at a window boundary of key %q; ", printable(s.Key))
	case strings.HasPrefix(s.Description, "sliding log"):
		fmt.Fprint(w, "the log starts empty; ")
	default:
		fmt.Fprint(w, "the bucket starts full; ")
	}
	fmt.Fprintf(w, "each request asks %s; one line per %v\n", tokens(s.Cost), shortDuration(step))
	if s.Reserve {
		bound := "without bound"
		if s.MaxReserved != nil {
			bound = "up to " + tokens(*s.MaxReserved) + " in debt"
		}
		fmt.Fprintf(w, "requests reserve, %s: one admitted while the bucket is short waits its turn; tokens left is negative while in debt; queued is the longest wait\n", bound)
	}
	fmt.Fprintf(w, "\n%8s %9s %9s %9s %12s %7s  # admitted . rejected (full bar: %d requests)\n", "from", "offered", "admitted", "rejected", "tokens left", "queued", most)
	for _, r := range s.Steps {
		hashes := (r.Admitted*simBarWidth + most - 1) / most
		dots := (r.Offered*simBarWidth+most-1)/most - hashes
		fmt.Fprintf(w, "%8s %9d %9d %9d %12d %7s  %s%s\n", shortDuration(time.Duration(r.From)), r.Offered, r.Admitted, r.Rejected, r.Left, queued(r.Queued),
			strings.Repeat("#", hashes), strings.Repeat(".", max(0, dots)))
	}
	t := s.totals()
	share := 0.0
	if t.Offered > 0 {
		share = 100 * float64(t.Admitted) / float64(t.Offered)
	}
	fmt.Fprintf(w, "\ntotal: %d offered, %d admitted (%.1f%%), %d rejected", t.Offered, t.Admitted, share, t.Rejected)
	if t.Queued > 0 {
		fmt.Fprintf(w, "; the longest queued %v", time.Duration(t.Queued).Round(time.Millisecond))
	}
	fmt.Fprintln(w)
}

// tokens says how many tokens, "1 token" or "2.5 tokens".
func tokens(n float64) string {
	if n == 1 {
		return "1 token"
	}
	return strconv.FormatFloat(n, 'f', -1, 64) + " tokens"
}

// queued prints a wait to the millisecond, "-" for none.
func queued(d seconds) string {
	if d <= 0 {
		return "-"
	}
	return shortDuration(time.Duration(d).Round(time.Millisecond))
}

// shortDuration is d as Go writes it, without the zero minutes and seconds
// Go adds to whole minutes and hours ("1m" rather than "1m0s").
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// writeSimCSV writes the steps under a header of simColumns' names.
func writeSimCSV(w io.Writer, s *simSeries) error {
	cw := csv.NewWriter(w)
	rec := make([]string, len(simColumns))
	for i, c := range simColumns {
		rec[i] = c.name
	}
	if err := cw.Write(rec); err != nil {
		return err
	}
	for i := range s.Steps {
		for k, c := range simColumns {
			rec[k] = c.value(&s.Steps[i])
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func writeSimJSON(w io.Writer, s *simSeries) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// writeOutput writes to the named file, or to stdout for "-". A file is
// written whole or not at all: to a temporary file beside it, then
// renamed, so a failure never leaves half a series where a good one was.
func writeOutput(name string, stdout io.Writer, write func(io.Writer) error) error {
	if name == "-" {
		return write(stdout)
	}
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*")
	if err == nil {
		defer os.Remove(f.Name())
		err = write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Chmod(f.Name(), 0o644)
		}
		if err == nil {
			err = os.Rename(f.Name(), name)
		}
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// describeLimit says what a limit allows, in the terms of the config.
func describeLimit(l *sluice.Limit) string {
	d := describeAlgorithm(l)
	if n := l.Shards(); n > 1 {
		d = fmt.Sprintf("%s, in %d shards of which each request reads two", d, n)
	}
	return d
}

func describeAlgorithm(l *sluice.Limit) string {
	p := l.Params()
	capacity := strconv.FormatFloat(l.Capacity(), 'f', -1, 64)
	per := shortDuration(engine.Duration(p.Period))
	if p.Calendar != 0 {
		per = "calendar " + p.Calendar.String() + " (" + l.Location().String() + ")"
	}
	switch l.Algorithm() {
	case sluice.SlidingWindow:
		return fmt.Sprintf("sliding window of %s per %s", capacity, per)
	case sluice.FixedWindow:
		return fmt.Sprintf("fixed window of %s per %s", capacity, per)
	case sluice.SlidingLog:
		return fmt.Sprintf("sliding log of %s per %s", capacity, shortDuration(engine.Duration(p.Period)))
	case sluice.LeakyBucket:
		return fmt.Sprintf("leaky bucket of %s, draining %s/s", capacity, strconv.FormatFloat(l.TokensPerSecond(), 'f', -1, 64))
	}
	return fmt.Sprintf("token bucket of %s, refilling %s/s", capacity, strconv.FormatFloat(l.TokensPerSecond(), 'f', -1, 64))
}

// pickLimit finds the named limit, or the policy's only one, by the
// names the decision API takes (policy.FindLimit): a file in the
// reference server's format has no rules of its own, and its limits go
// by their rule names or the file's own names for them.
func pickLimit(p *policy.Policy, name string) (lim *sluice.Limit, err error) {
	if name != "" {
		_, lim, err = p.FindLimit(name)
	} else if all := p.NamedLimits(); len(all) == 1 {
		lim = all[0]
	} else {
		return nil, fmt.Errorf("the policy has %d limits: name one with --limit (%s)", len(all), p.ListLimits())
	}
	if err == nil && lim.Algorithm() == sluice.Concurrency {
		// Arrivals alone say nothing of how many are in flight.
		return nil, fmt.Errorf("limit %q is a concurrency limit: simulate replays arrivals, not how long each request runs, so it cannot say how many are in flight", lim.Name())
	}
	return lim, err
}

// patternSyntax says what --pattern accepts; every pattern error ends
// with it.
const patternSyntax = `segments of "RATE/s for DURATION" separated by commas, e.g. "50/s for 2s, 5/s for 10s" (rates per s, m or h; durations with a unit: 500ms, 10s, 1m30s, 2h)`

// parsePattern reads "RATE/s for DURATION" segments separated by commas.
func parsePattern(s string) ([]segment, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty")
	}
	var segs []segment
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		rateS, durS, ok := strings.Cut(part, " for ")
		if !ok {
			return nil, fmt.Errorf(`segment %d %q: want "RATE/s for DURATION"`, i+1, part)
		}
		durS = strings.TrimSpace(durS)
		if first, rest, ok := strings.Cut(durS, " "); ok && strings.Contains(rest, " for ") {
			return nil, fmt.Errorf(`segment %d %q: a comma is missing between two segments: "%s for %s, %s"`, i+1, part, strings.TrimSpace(rateS), first, strings.TrimSpace(rest))
		}
		num, unit, ok := strings.Cut(strings.TrimSpace(rateS), "/")
		per := map[string]float64{"s": 1, "m": 60, "h": 3600}[unit]
		if !ok || per == 0 {
			return nil, fmt.Errorf(`segment %d %q: the rate is "N/s", "N/m" or "N/h"`, i+1, part)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return nil, fmt.Errorf("segment %d %q: the rate must be a finite number >= 0", i+1, part)
		}
		d, err := time.ParseDuration(durS)
		if err != nil {
			if f, ferr := strconv.ParseFloat(durS, 64); ferr == nil && f > 0 {
				return nil, fmt.Errorf("segment %d %q: the duration %q has no unit: write %ss (or ms, m, h)", i+1, part, durS, durS)
			}
			return nil, fmt.Errorf("segment %d %q: %q is not a duration: write it like 10s or 1m30s", i+1, part, durS)
		}
		if d <= 0 {
			return nil, fmt.Errorf("segment %d %q: the duration must be positive, like 10s or 1m30s", i+1, part)
		}
		segs = append(segs, segment{rate: v / per, d: d})
	}
	return segs, nil
}
