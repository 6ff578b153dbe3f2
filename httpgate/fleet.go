package httpgate

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/internal/tick"
)

// The fleet on the live page. Every process of a fleet that shares a
// store (Redis, PostgreSQL: the stores that keep shared values, as the
// adaptive rates do) publishes an insight.Report of its statistics under
// fleet:proc:<id> once a second (RunFleet), to expire after FleetTTL, and
// lists its id in the roster, fleet:roster, one small value that the
// processes change by compare-and-swap. A page reads the roster and the
// reports of at most MaxFleet processes, and merges them with its own
// process's statistics. Over the memory store a process is a fleet of
// one, and nothing is published.
//
// A process is live while its last report is at most FleetLive old, and
// stale after, until its report expires; its counts of the window stay
// in the totals either way (they happened).

// Bounds and timing of the fleet's reports.
const (
	// MaxFleet is the most processes the roster lists, and so a page
	// reads: a process that finds it full of live ones is left out of the
	// page (and says so in its log) until one leaves.
	MaxFleet = 32
	// FleetInterval is how often a process publishes its report.
	FleetInterval = time.Second
	// FleetLive is how old a report may be for its process to be live.
	FleetLive = 5 * time.Second
	// FleetTTL is how long a report outlives its process's last
	// publication, and a roster entry its last renewal.
	FleetTTL = 30 * time.Second
)

// fleetRetries bounds the compare-and-swap attempts of one write: each
// conflict means another process has just written.
const fleetRetries = 3

const (
	fleetRosterKey = "fleet:roster"
	fleetProcKey   = "fleet:proc:"
)

// fleetState is this process's place in its fleet.
type fleetState struct {
	id, host string
	enrolled atomic.Int64 // Unix milliseconds of the last renewal of its roster entry
}

// newProcessID is this process's id: the host name (bounded) and 64
// random bits, so that two processes never share one, restarts included.
func newProcessID() (id, host string) {
	host, _ = os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r < 0x21 || r > 0x7e {
			return '_'
		}
		return r
	}, host)
	host = host[:min(len(host), 64)]
	host = cmp.Or(host, "unknown")
	var b [8]byte
	rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return host + "-" + hex.EncodeToString(b[:]), host
}

// fleetValues is the store's shared values, found beneath any wrappers
// (metrics' InstrumentStore); nil over a store without them (the memory
// store: a fleet of one).
func (g *Gate) fleetValues() adaptive.Values {
	if g.lim == nil {
		return nil
	}
	v, _ := beneath[adaptive.Values](g.lim.Store())
	return v
}

// ProcessID is the id this process publishes its statistics under.
func (g *Gate) ProcessID() string { return g.fleet.id }

// RunFleet publishes this process's statistics to the fleet every
// FleetInterval until ctx ends, when the gate has a live page and its
// store shares values; otherwise it returns at once.
func (g *Gate) RunFleet(ctx context.Context) {
	if g.opts.Insight == nil || g.fleetValues() == nil {
		return
	}
	failing := false
	publish := func() {
		err := g.PublishFleet(ctx)
		switch {
		case err != nil && !failing:
			g.opts.Logger.Warn("live page: this process's statistics did not reach the fleet", "err", err)
		case err == nil && failing:
			g.opts.Logger.Info("live page: this process's statistics reach the fleet again")
		}
		failing = err != nil
	}
	publish()
	tick.Every(ctx, FleetInterval, publish)
}

// PublishFleet publishes this process's statistics now: its report, and
// its entry in the roster when missing or a third of FleetTTL old.
func (g *Gate) PublishFleet(ctx context.Context) error {
	v := g.fleetValues()
	if g.opts.Insight == nil || v == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, min(peekTimeout, g.opts.StoreTimeout))
	defer cancel()
	snap := g.opts.Insight.Snapshot(insight.MaxReportKeys)
	raw, err := insight.NewReport(g.fleet.id, g.fleet.host, snap).Encode()
	if err != nil {
		return err
	}
	if err := g.writeOwn(ctx, v, fleetProcKey+g.fleet.id, raw); err != nil {
		return err
	}
	return g.enrol(ctx, v, snap.Now)
}

// writeOwn sets key, which only this process writes, to raw.
func (g *Gate) writeOwn(ctx context.Context, v adaptive.Values, key, raw string) error {
	for range fleetRetries {
		old, _, err := v.LoadValue(ctx, key)
		if err != nil {
			return fmt.Errorf("fleet report: %w", err)
		}
		ok, err := v.CompareAndSwapValue(ctx, key, old, raw, FleetTTL)
		if err != nil {
			return fmt.Errorf("fleet report: %w", err)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("fleet report %q kept changing", key)
}

// roster is the fleet's roster: each process's id and when it last
// renewed its entry, in Unix milliseconds.
type roster map[string]int64

// enrol renews this process's entry in the roster, dropping entries not
// renewed for FleetTTL.
func (g *Gate) enrol(ctx context.Context, v adaptive.Values, now time.Time) error {
	nowMs := now.UnixMilli()
	if last := g.fleet.enrolled.Load(); last != 0 && nowMs-last < FleetTTL.Milliseconds()/3 {
		return nil
	}
	for range fleetRetries {
		raw, ok, err := v.LoadValue(ctx, fleetRosterKey)
		if err != nil {
			return fmt.Errorf("fleet roster: %w", err)
		}
		r := roster{}
		if ok && json.Unmarshal([]byte(raw), &r) != nil {
			r = roster{} // not ours to trust: written over
		}
		for id, at := range r {
			if nowMs-at >= FleetTTL.Milliseconds() || len(id) > 200 {
				delete(r, id)
			}
		}
		if _, in := r[g.fleet.id]; !in && len(r) >= MaxFleet {
			return fmt.Errorf("the fleet roster lists %d live processes, its most: this one is left off the live page", len(r))
		}
		r[g.fleet.id] = nowMs
		val, _ := json.Marshal(r)
		old := ""
		if ok {
			old = raw
		}
		swapped, err := v.CompareAndSwapValue(ctx, fleetRosterKey, old, string(val), FleetTTL)
		if err != nil {
			return fmt.Errorf("fleet roster: %w", err)
		}
		if swapped {
			g.fleet.enrolled.Store(nowMs)
			return nil
		}
	}
	return fmt.Errorf("the fleet roster kept changing")
}

// fleetReports reads the reports of the other processes the roster
// lists (MaxFleet at most), skipping those gone or unreadable.
func (g *Gate) fleetReports(ctx context.Context, v adaptive.Values) ([]insight.Report, error) {
	raw, ok, err := v.LoadValue(ctx, fleetRosterKey)
	if err != nil || !ok {
		return nil, err
	}
	r := roster{}
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return nil, fmt.Errorf("fleet roster: %w", err)
	}
	delete(r, g.fleet.id)
	ids := slices.Sorted(maps.Keys(r))
	if len(ids) > MaxFleet-1 {
		ids = ids[:MaxFleet-1]
	}
	var out []insight.Report
	for _, id := range ids {
		raw, ok, err := v.LoadValue(ctx, fleetProcKey+id)
		if err != nil {
			return out, err
		}
		if !ok {
			continue // gone: its report expired
		}
		rep, err := insight.DecodeReport(raw)
		if err != nil || rep.ID != id {
			continue
		}
		out = append(out, rep)
	}
	return out, nil
}
