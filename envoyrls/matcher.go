package envoyrls

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"
	"weak"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/policy"
)

// Matcher finds what applies to the descriptors of a call. A Server
// holds the one its policy came with: a sluice policy's rules (every rule
// whose match holds, keyed by its limit_keys), or the *Reference of a file
// in the reference server's format (ParseReferenceConfig), which finds
// limits the way that server does.
type Matcher interface {
	// Match fills found[i] for req.Descriptors[i]; found has one entry per
	// descriptor. An error is the caller's fault: the call is answered
	// InvalidArgument, and nothing is charged.
	Match(req *rlspb.RateLimitRequest, found []Found) error
}

// Found is what applies to one descriptor of a call.
type Found struct {
	// Limits are the limits that decide it, each with its rule, limit and
	// key. The Server sets each one's cost from the descriptor's hits
	// (and takes no reservation, not even of a limit that always
	// reserves: Envoy has no reserved turns).
	Limits []policy.Match
	// Limit, when set, is the current_limit its status reports; when nil,
	// the status reports the deciding limit, described in the protocol's
	// units.
	Limit *rlspb.RateLimitResponse_RateLimit
	// Unlimited is never limited: OK with the largest limit_remaining.
	Unlimited bool
	// Blocked is over the limit with no bucket to ask (the reference
	// format's requests_per_unit: 0), unless Shadow, which only reports
	// it. Its duration_until_reset is the rest of the current Window,
	// aligned to the epoch.
	Blocked, Shadow bool
	Window          time.Duration
	// Quota marks a quota-mode descriptor (the reference format's
	// quota_mode, or QUOTA_MODE for every descriptor): over its limit it
	// fails the call only when every quota descriptor of the call is over
	// (see Server.decide).
	Quota bool
}

// rules matches descriptors with a sluice policy's rules: every rule
// whose match holds (on domain and descriptor:KEY values) applies, keyed
// by its limit_keys.
type rules struct{ pol *policy.Policy }

// Match implements Matcher.
func (m rules) Match(req *rlspb.RateLimitRequest, found []Found) error {
	return m.matchInto(req, &scratch{found: found})
}

// matchInto is Match into sc.found, with sc's buffers: the matches of
// every descriptor share sc.ms.
func (m rules) matchInto(req *rlspb.RateLimitRequest, sc *scratch) error {
	for i, d := range req.Descriptors {
		sc.entries = sc.entries[:0]
		for _, en := range d.Entries {
			sc.entries = append(sc.entries, policy.DescriptorEntry{Key: en.Key, Value: en.Value})
		}
		sc.in = policy.Input{Domain: req.Domain, Descriptor: sc.entries}
		start := len(sc.ms)
		var err error
		if sc.ms, err = m.pol.AppendMatch(sc.ms, &sc.in); err != nil {
			return fmt.Errorf("descriptors[%d]: %v", i, err)
		}
		limited := slices.DeleteFunc(sc.ms[start:], func(m policy.Match) bool { return m.Request.Limit == nil })
		sc.ms = sc.ms[:start+len(limited)]
		// Capped, so that no later append writes into another's limits.
		sc.found[i] = Found{Limits: limited[:len(limited):len(limited)]}
	}
	return nil
}

// matcherOf is the Matcher of pol: the reference lookup it was parsed
// with (ParseReferenceConfig), else its rules.
func matcherOf(pol *policy.Policy) Matcher {
	if ref := referenceOf(pol); ref != nil {
		return ref
	}
	return rules{pol}
}

// references holds the lookup of each policy that ParseReferenceConfig
// made, by the policy: a Policy is rules and holds nothing of a
// transport's, so the Envoy service finds a policy's lookup here. An entry
// goes once its policy is collected.
var references sync.Map // weak.Pointer[policy.Policy] -> *Reference

// register records ref as the lookup of pol.
func register(pol *policy.Policy, ref *Reference) {
	k := weak.Make(pol)
	references.Store(k, ref)
	runtime.AddCleanup(pol, func(k weak.Pointer[policy.Policy]) { references.Delete(k) }, k)
}

// referenceOf is the lookup of a policy that ParseReferenceConfig made;
// nil for any other policy.
func referenceOf(pol *policy.Policy) *Reference {
	if v, ok := references.Load(weak.Make(pol)); ok {
		return v.(*Reference)
	}
	return nil
}
