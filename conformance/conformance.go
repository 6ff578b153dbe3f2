// Package conformance is package engine's runner: the vectors and
// property tests that every sluice Store must pass, so that "the same
// semantics on every store" is a test rather than a promise. A store's
// test calls Run and RunInvariants with a constructor that wires the store
// to the given clock.
//
// The vectors (testdata/vectors.json) are written by an independent oracle,
// testdata/gen_vectors.py, which computes with exact fractions from the
// formulas, sharing no code with any engine. The semantics they and the
// invariants check are stated in docs/concepts.md: its Algorithms,
// Reservations and debt, Costs and limits, Decisions, Shards, All or
// nothing and Settlement sections are what a store must do.
package conformance

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

//go:embed testdata/vectors.json
var vectorsJSON []byte

// NewStore returns a fresh, empty store that reads its time from clock.
type NewStore func(t *testing.T, clock sluice.Clock) sluice.Store

// Vectors is the parsed vectors file.
type Vectors struct {
	Cases []Case `json:"cases"`
}

// Case is one request sequence against one limit and key.
type Case struct {
	Name  string    `json:"name"`
	Note  string    `json:"note,omitempty"`
	Key   string    `json:"key"`
	Limit LimitSpec `json:"limit"`
	Steps []Step    `json:"steps"`
}

// LimitSpec is a limit as the vectors write it.
type LimitSpec struct {
	Algorithm       string  `json:"algorithm"`
	TokensPerSecond float64 `json:"tokens_per_second,omitempty"`
	Burst           float64 `json:"burst,omitempty"`
	Rate            float64 `json:"rate,omitempty"`
	PeriodUs        int64   `json:"period_us,omitempty"`
	// Capacity is absent for the default; 0 is a bucket that holds
	// nothing (sluice.ZeroCapacity).
	Capacity *float64 `json:"capacity,omitempty"`
	StartUs  *int64   `json:"start_us,omitempty"`
	// Calendar (day, week, month, year) and Timezone (IANA, default UTC)
	// align the windows to the calendar (sluice.Spec.Calendar).
	Calendar    string  `json:"calendar,omitempty"`
	Timezone    string  `json:"timezone,omitempty"`
	MaxReserved float64 `json:"max_reserved,omitempty"`
	MaxDelayUs  int64   `json:"max_delay_us,omitempty"`
	// Reserve makes every request of the limit reserve (sluice.Spec.Reserve).
	Reserve bool `json:"reserve,omitempty"`
	// MaxInFlight and LeaseUs describe a concurrency limit.
	MaxInFlight int   `json:"max_in_flight,omitempty"`
	LeaseUs     int64 `json:"lease_us,omitempty"`
}

// Step is one request and its expected answer.
type Step struct {
	TUs         int64   `json:"t_us"`
	Op          string  `json:"op,omitempty"`
	Cost        float64 `json:"cost,omitempty"`
	Reserve     bool    `json:"reserve,omitempty"`
	MaxReserved float64 `json:"max_reserved,omitempty"`
	Want        *Want   `json:"want,omitempty"`
	WantError   string  `json:"want_error,omitempty"`
	// Lease names the lease of a concurrency limit's step (acquire,
	// release, renew, peek): a label that Run maps to a random
	// engine.LeaseID.
	Lease string `json:"lease,omitempty"`
	// Limit, when set, replaces the case's limit from this step on, under
	// the same name: a reload that changed the limit's parameters, which
	// the key's existing state must survive, converted.
	Limit *LimitSpec `json:"limit,omitempty"`
}

// Want is the exact expected outcome.
type Want struct {
	Allowed      bool  `json:"allowed"`
	Remaining    int64 `json:"remaining"`
	Tokens       int64 `json:"tokens"`
	RetryAfterUs int64 `json:"retry_after_us"`
	ResetAfterUs int64 `json:"reset_after_us"`
}

// Load parses the embedded vectors.
func Load() (Vectors, error) {
	var v Vectors
	if err := json.Unmarshal(vectorsJSON, &v); err != nil {
		return v, fmt.Errorf("conformance vectors: %w", err)
	}
	return v, nil
}

// Limit compiles the case's limit, named after the case.
func (c Case) Compile() (*sluice.Limit, error) {
	alg, err := sluice.ParseAlgorithm(c.Limit.Algorithm)
	if err != nil {
		return nil, err
	}
	s := sluice.Spec{
		Name: c.Name, Algorithm: alg,
		TokensPerSecond: c.Limit.TokensPerSecond, Burst: c.Limit.Burst,
		Rate: c.Limit.Rate, Period: time.Duration(c.Limit.PeriodUs) * time.Microsecond,
		MaxReserved: c.Limit.MaxReserved, Reserve: c.Limit.Reserve,
		MaxDelay:    time.Duration(c.Limit.MaxDelayUs) * time.Microsecond,
		MaxInFlight: c.Limit.MaxInFlight, LeaseTerm: time.Duration(c.Limit.LeaseUs) * time.Microsecond,
	}
	if c.Limit.Capacity != nil {
		s.Capacity = *c.Limit.Capacity
		s.Capacity = cmp.Or(s.Capacity, sluice.ZeroCapacity)
	}
	if c.Limit.Calendar != "" {
		var ok bool
		if s.Calendar, ok = engine.ParseCalendar(c.Limit.Calendar); !ok {
			return nil, fmt.Errorf("unknown calendar period %q", c.Limit.Calendar)
		}
		s.Timezone = c.Limit.Timezone
	}
	if c.Limit.StartUs != nil {
		d := time.Duration(*c.Limit.StartUs) * time.Microsecond
		s.Start = &d
	}
	return sluice.NewLimit(s)
}

// Run runs every vector against a fresh store per case, checking each
// decision field exactly.
func Run(t *testing.T, newStore NewStore) {
	t.Helper()
	v, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range v.Cases {
		t.Run(c.Name, func(t *testing.T) {
			lim, err := c.Compile()
			if err != nil {
				t.Fatalf("limit: %v", err)
			}
			clock := sluice.NewManualClock(time.UnixMicro(0))
			store := newStore(t, clock)
			ctx := context.Background()
			ids := map[string]engine.LeaseID{}
			for i, s := range c.Steps {
				clock.Set(time.UnixMicro(s.TUs))
				if s.Limit != nil {
					if lim, err = (Case{Name: c.Name, Limit: *s.Limit}).Compile(); err != nil {
						t.Fatalf("step %d: limit: %v", i, err)
					}
				}
				if s.Op == "reset" {
					if err := store.Reset(ctx, lim, c.Key); err != nil {
						t.Fatalf("step %d: reset: %v", i, err)
					}
					continue
				}
				if lop, ok := leaseOps[s.Op]; ok && lim.Algorithm() == sluice.Concurrency {
					var id engine.LeaseID
					if s.Lease != "" {
						if _, seen := ids[s.Lease]; !seen {
							ids[s.Lease] = engine.NewLeaseID()
						}
						id = ids[s.Lease]
					}
					d, err := store.Lease(ctx, lop, sluice.Request{Limit: lim, Key: c.Key}, id)
					if err != nil {
						t.Fatalf("step %d (t=%dus %s %s): %v", i, s.TUs, s.Op, s.Lease, err)
					}
					CheckDecision(t, fmt.Sprintf("step %d (t=%dus %s %s)", i, s.TUs, s.Op, s.Lease), lim, d, *s.Want)
					continue
				}
				op := engine.OpTake
				switch s.Op {
				case "peek":
					op = engine.OpPeek
				case "refund":
					op = engine.OpRefund
				}
				d, err := Take(ctx, store, op, sluice.Request{Limit: lim, Key: c.Key, Cost: s.Cost, Reserve: s.Reserve, MaxReserved: s.MaxReserved})
				if s.WantError != "" {
					if !matchesError(err, s.WantError) {
						t.Fatalf("step %d (t=%dus): want error %s, got %v (decision %+v)", i, s.TUs, s.WantError, err, d)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d (t=%dus): %v", i, s.TUs, err)
				}
				CheckDecision(t, fmt.Sprintf("step %d (t=%dus %s cost=%v)", i, s.TUs, s.Op, s.Cost), lim, d, *s.Want)
			}
		})
	}
}

// CheckDecision compares d with w field by field.
func CheckDecision(t *testing.T, where string, lim *sluice.Limit, d sluice.Decision, w Want) {
	t.Helper()
	got := Want{
		Allowed: d.Allowed, Remaining: d.Remaining,
		Tokens:       int64(d.Tokens * engine.TokenScale),
		RetryAfterUs: int64(d.RetryAfter / time.Microsecond),
		ResetAfterUs: int64(d.ResetAfter / time.Microsecond),
	}
	// Tokens travel as float64 in a Decision; compare at micro-token
	// precision with the rounding of that conversion allowed for.
	if diff := got.Tokens - w.Tokens; diff >= -1 && diff <= 1 {
		got.Tokens = w.Tokens
	}
	if got != w {
		t.Fatalf("%s:\n got  %+v\n want %+v", where, got, w)
	}
	if d.Rule != lim.Name() {
		t.Fatalf("%s: decision names rule %q, want %q", where, d.Rule, lim.Name())
	}
	if wantLimit := int64(lim.Capacity()); d.Capacity != wantLimit {
		t.Fatalf("%s: limit %d, want %d", where, d.Capacity, wantLimit)
	}
}

// leaseOps are the store ops of a concurrency limit's steps.
var leaseOps = map[string]engine.Op{"acquire": engine.OpTake, "peek": engine.OpPeek, "release": engine.OpRelease, "renew": engine.OpRenew}

func matchesError(err error, name string) bool {
	switch name {
	case "lease_required":
		return errors.Is(err, sluice.ErrLeaseRequired)
	case "cost_exceeds_limit":
		return errors.Is(err, sluice.ErrCostExceedsLimit)
	case "invalid_cost":
		return errors.Is(err, sluice.ErrInvalidCost)
	case "reserve_unsupported":
		return errors.Is(err, sluice.ErrReserveUnsupported)
	}
	return false
}
