package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
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
// every run. It prints, per step, the requests offered, admitted and
// rejected and the whole tokens left, with a bar of admitted (#) and
// rejected (.) requests.
func runSimulate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("simulate", "usage: sluice simulate [--config FILE] [--limit NAME] --pattern \"50/s for 2s, 5/s for 10s\" [--step 1s] [--cost 1]\n\nReplays the pattern against the limit on the memory store with a simulated\nclock (the answer does not depend on the machine) and draws, per step, what\nthe limit admitted (#) and rejected (.).", stderr)
	config := fs.String("config", "", "policy file (YAML or JSON); default: the embedded per-IP policy")
	limitName := fs.String("limit", "", `the limit to drive: a rule's name, or "RULE.TIER" (default: the policy's only limit)`)
	pattern := fs.String("pattern", "", `the traffic: segments of "RATE/s for DURATION", e.g. "50/s for 2s, 5/s for 10s" (/m and /h too)`)
	step := fs.Duration("step", time.Second, "the interval of each printed line")
	cost := fs.Float64("cost", 1, "tokens each request asks")
	key := fs.String("key", "simulated", "the bucket's key")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice simulate: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	segs, err := parsePattern(*pattern)
	if err != nil {
		fmt.Fprintf(stderr, "sluice simulate: --pattern: %v\n", err)
		return 2
	}
	if *step <= 0 {
		fmt.Fprintln(stderr, "sluice simulate: --step must be positive")
		return 2
	}
	if math.IsNaN(*cost) || math.IsInf(*cost, 0) || *cost <= 0 {
		fmt.Fprintf(stderr, "sluice simulate: --cost must be a finite number > 0, got %v\n", *cost)
		return 2
	}
	var total time.Duration
	var requests float64
	for _, s := range segs {
		total += s.d
		requests += math.Floor(s.rate * s.d.Seconds())
	}
	if requests > maxSimRequests {
		fmt.Fprintf(stderr, "sluice simulate: the pattern makes %.0f requests, at most %d\n", requests, maxSimRequests)
		return 2
	}
	steps := int((total + *step - 1) / *step)
	if steps > maxSimSteps {
		fmt.Fprintf(stderr, "sluice simulate: %v in steps of %v is %d lines, at most %d: use a longer --step\n", total, *step, steps, maxSimSteps)
		return 2
	}

	p := policy.Default()
	if *config != "" {
		if p, err = loadPolicy(*config); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	lim, err := pickLimit(p, *limitName)
	if err != nil {
		fmt.Fprintf(stderr, "sluice simulate: %v\n", err)
		return 2
	}
	rows, err := simulate(lim, *key, *cost, segs, *step)
	if err != nil {
		fmt.Fprintf(stderr, "sluice simulate: %v\n", err)
		return 1
	}
	printSimulation(stdout, lim, rows, *step)
	return 0
}

// simRow is one step of a simulation.
type simRow struct {
	offered, admitted int
	remaining         int64 // whole tokens left after the step's last request
}

// simulate drives lim with the pattern on a fresh memory store whose
// clock only moves to each request's time.
func simulate(lim *sluice.Limit, key string, cost float64, segs []segment, step time.Duration) ([]simRow, error) {
	start := time.Unix(1_700_000_000, 0) // any instant: only differences matter
	clock := sluice.NewManualClock(start)
	l := sluice.New(memory.New(memory.Options{Clock: clock, PreciseClock: true}))
	var total time.Duration
	for _, s := range segs {
		total += s.d
	}
	rows := make([]simRow, int((total+step-1)/step))
	// Before any request the bucket is full.
	full, err := l.Peek(context.Background(), sluice.Request{Limit: lim, Key: key, Cost: cost})
	if err != nil {
		return nil, err
	}
	for i := range rows {
		rows[i].remaining = -1
	}
	remaining := full.Remaining
	var at time.Duration // start of the segment
	for _, s := range segs {
		n := int(math.Floor(s.rate * s.d.Seconds()))
		for k := range n {
			t := at + time.Duration(float64(k)/s.rate*float64(time.Second))
			clock.Set(start.Add(t))
			d, err := l.Take(context.Background(), sluice.Request{Limit: lim, Key: key, Cost: cost})
			if err != nil {
				return nil, err
			}
			r := &rows[min(int(t/step), len(rows)-1)]
			r.offered++
			if d.Allowed {
				r.admitted++
			}
			r.remaining = d.Remaining
		}
		at += s.d
	}
	// A step without requests shows the tokens as the last request left them.
	for i := range rows {
		if rows[i].remaining < 0 {
			rows[i].remaining = remaining
		}
		remaining = rows[i].remaining
	}
	return rows, nil
}

func printSimulation(w io.Writer, lim *sluice.Limit, rows []simRow, step time.Duration) {
	most := 1
	for _, r := range rows {
		most = max(most, r.offered)
	}
	fmt.Fprintf(w, "limit %s: %s\n\n", lim.Name(), describeLimit(lim))
	fmt.Fprintf(w, "%10s %8s %8s %8s %6s  admitted # rejected .\n", "from", "offered", "admitted", "rejected", "left")
	var offered, admitted int
	for i, r := range rows {
		offered += r.offered
		admitted += r.admitted
		hashes := (r.admitted*simBarWidth + most - 1) / most
		dots := (r.offered*simBarWidth+most-1)/most - hashes
		fmt.Fprintf(w, "%10s %8d %8d %8d %6d  %s%s\n", time.Duration(i)*step, r.offered, r.admitted, r.offered-r.admitted, r.remaining,
			strings.Repeat("#", hashes), strings.Repeat(".", max(0, dots)))
	}
	share := 0.0
	if offered > 0 {
		share = 100 * float64(admitted) / float64(offered)
	}
	fmt.Fprintf(w, "\ntotal: %d offered, %d admitted (%.1f%%), %d rejected\n", offered, admitted, share, offered-admitted)
}

// describeLimit says what a limit allows, in the terms of the config.
func describeLimit(l *sluice.Limit) string {
	p := l.Params()
	capacity := strconv.FormatFloat(l.Capacity(), 'f', -1, 64)
	switch l.Algorithm() {
	case sluice.FixedWindow:
		return fmt.Sprintf("fixed window of %s per %v", capacity, sluice.Duration(p.Period))
	case sluice.SlidingLog:
		return fmt.Sprintf("sliding log of %s per %v", capacity, sluice.Duration(p.Period))
	case sluice.LeakyBucket:
		return fmt.Sprintf("leaky bucket of %s, draining %s/s", capacity, strconv.FormatFloat(l.TokensPerSecond(), 'f', -1, 64))
	}
	return fmt.Sprintf("token bucket of %s, refilling %s/s", capacity, strconv.FormatFloat(l.TokensPerSecond(), 'f', -1, 64))
}

// pickLimit finds the named limit, or the policy's only one. A file in
// the reference server's format has limits but no rules of its own.
func pickLimit(p *policy.Policy, name string) (*sluice.Limit, error) {
	all := p.Limits()
	if _, ref, ok := envoyrls.ReferenceLimits(p); ok {
		all = ref
	}
	if name != "" {
		if l := p.Limit(name); l != nil {
			return l, nil
		}
		for _, l := range all {
			if l.Name() == name {
				return l, nil
			}
		}
	} else if len(all) == 1 {
		return all[0], nil
	}
	names := make([]string, len(all))
	for i, l := range all {
		names[i] = l.Name()
	}
	if name == "" {
		return nil, fmt.Errorf("the policy has %d limits: name one with --limit (%s)", len(all), strings.Join(names, ", "))
	}
	return nil, fmt.Errorf("no limit %q in the policy (it has: %s)", name, strings.Join(names, ", "))
}

// parsePattern reads "RATE/s for DURATION" segments separated by commas.
func parsePattern(s string) ([]segment, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New(`empty: give segments of "RATE/s for DURATION", e.g. "50/s for 2s, 5/s for 10s"`)
	}
	var segs []segment
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		rateS, durS, ok := strings.Cut(part, " for ")
		if !ok {
			return nil, fmt.Errorf(`segment %d %q: want "RATE/s for DURATION"`, i+1, part)
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
		d, err := time.ParseDuration(strings.TrimSpace(durS))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("segment %d %q: the duration must be positive, like 10s or 1m30s", i+1, part)
		}
		segs = append(segs, segment{rate: v / per, d: d})
	}
	return segs, nil
}
