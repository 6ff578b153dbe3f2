package envoyrls

// What a call asks: each descriptor's cost, the call's bounds, and the
// matches it charges.

import (
	"errors"
	"fmt"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/policy"
)

// costOf is a descriptor's cost as the protocol defines it: the
// descriptor's own hits_addend when set (0 checks without charging), else
// the request's, at least 1; is_negative_hits gives tokens back.
func costOf(req *rlspb.RateLimitRequest, d *rlv3.RateLimitDescriptor) (descKind, float64) {
	hits := uint64(max(1, req.HitsAddend))
	if d.HitsAddend != nil {
		hits = d.HitsAddend.Value
	}
	hits = min(hits, maxHits)
	switch {
	case d.IsNegativeHits && hits > 0:
		return kindRefund, float64(hits)
	case hits == 0:
		return kindPeek, 1
	}
	return kindTake, float64(hits)
}

// validate checks req against the bounds on a request, maxBytes among
// them.
func validate(req *rlspb.RateLimitRequest, maxBytes int) error {
	switch {
	case req.Domain == "":
		return fmt.Errorf("rate limit domain must not be empty")
	case len(req.Descriptors) == 0:
		return fmt.Errorf("rate limit descriptor list must not be empty")
	case len(req.Descriptors) > maxDescriptors:
		return fmt.Errorf("%d descriptors: at most %d per request", len(req.Descriptors), maxDescriptors)
	case len(req.Domain) > maxEntryBytes:
		return fmt.Errorf("domain longer than %d bytes", maxEntryBytes)
	}
	total := len(req.Domain)
	for i, d := range req.Descriptors {
		if d == nil || len(d.Entries) == 0 {
			return fmt.Errorf("descriptors[%d]: no entries", i)
		}
		if len(d.Entries) > maxEntries {
			return fmt.Errorf("descriptors[%d]: %d entries, at most %d", i, len(d.Entries), maxEntries)
		}
		for j, en := range d.Entries {
			if en == nil || en.Key == "" {
				return fmt.Errorf("descriptors[%d].entries[%d]: empty key", i, j)
			}
			if len(en.Key) > maxEntryBytes || len(en.Value) > maxEntryBytes {
				return fmt.Errorf("descriptors[%d].entries[%d]: key or value longer than %d bytes", i, j, maxEntryBytes)
			}
			if total += len(en.Key) + len(en.Value); total > maxBytes {
				return fmt.Errorf("descriptors[%d].entries[%d]: the domain, keys and values pass %d bytes together (max_recv_bytes)", i, j, maxBytes)
			}
		}
	}
	return nil
}

// ask sets m's request as the Server asks it: cost, and no reservation.
// Envoy has no notion of a reserved turn: it would pass at once every
// turn a leaky bucket or a bucket of zero capacity gives.
func ask(m *policy.Match, cost float64) {
	m.Request.Cost = cost
	m.Request.Reserve, m.Request.NoReserve = false, true
}

// tooBig reports whether a cost asks more than an enforce-mode limit of
// ms, as the rule gives it, can ever hold (sluice.Request.Charge's rule),
// and asks each match for cost (ask). The charge of each is computed once
// (policy.Match.CostExceedsLimit), and the take reuses it; only a cost
// beyond what a limit holds without a reservation is judged again with
// the rule's own reservation, which may hold it.
func tooBig(ms []policy.Match, cost float64) bool {
	big := false
	for j := range ms {
		m := &ms[j]
		asGiven := m.Request
		asGiven.Cost = cost
		ask(m, cost)
		if big || m.Rule.Mode == policy.Shadow || !m.CostExceedsLimit() {
			continue
		}
		_, err := asGiven.Charged(engine.OpTake)
		big = asGiven == m.Request || errors.Is(err, sluice.ErrCostExceedsLimit)
	}
	return big
}
