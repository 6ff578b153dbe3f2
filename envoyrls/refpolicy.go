package envoyrls

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/serverconf"
)

// IsReferenceConfig reports whether data is in the reference server's
// format (a top-level "domain") rather than sluice's own (top-level
// "rules" and settings).
func IsReferenceConfig(data []byte) bool {
	var top map[string]any
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&top); err != nil {
		return false
	}
	_, hasDomain := top["domain"]
	_, hasRules := top["rules"]
	return hasDomain && !hasRules
}

// ParseReferenceConfig reads a configuration in the reference server's
// format (envoyproxy/ratelimit: domain, nested descriptors with key, value,
// rate_limit, shadow_mode, unlimited, replaces, wildcard values; several
// domains as several YAML documents) and compiles each rate_limit into a
// sluice rule: a fixed window of unit (times unit_multiplier), aligned to
// the epoch as the reference server aligns it, holding requests_per_unit.
// Every problem is reported at once, as FILE:LINE: path: message.
//
// The returned policy has the default settings and no rules of its own:
// the file only speaks about Envoy descriptors, so the HTTP paths limit
// nothing. The decision API reaches each limit by name (see
// policy.NameOnly): its rule's ("envoy.DOMAIN.N") or its rate_limit's
// name. A Server enforcing the policy finds limits with the file's
// *Reference, exactly as the reference server does (see the package
// documentation), which this package keeps for the policy (the policy
// holds nothing of Envoy's); they are enforced with policy.Enforce, like
// any other rule.
func ParseReferenceConfig(filename string, data []byte) (*policy.Policy, error) {
	cfg, err := parseReference(filename, data)
	if err != nil {
		return nil, err
	}
	return referencePolicy(filename, cfg)
}

// referencePolicy is the policy enforcing cfg's limits, read from source.
func referencePolicy(filename string, cfg *Reference) (*policy.Policy, error) {
	named := make([]policy.NamedRule, 0, len(cfg.limits))
	for _, l := range cfg.limits {
		mode := policy.EnforceMode
		if l.shadow {
			mode = policy.Shadow
		}
		lim, err := sluice.NewLimit(sluice.Spec{Name: l.id, Algorithm: sluice.FixedWindow, Rate: float64(l.rpu), Period: l.period(), Start: new(time.Duration)})
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %s: %w", filename, l.id, l.path, err)
		}
		l.policyRule = &policy.Rule{Name: l.rule, Mode: mode, OnStoreError: policy.AllowOnError, Limit: lim, Algorithm: sluice.FixedWindow}
		named = append(named, policy.NamedRule{Rule: l.policyRule, Alias: l.name})
	}
	// The decision API and sluice simulate reach each limit by its rule
	// name and by the file's own name for it.
	pol := policy.NameOnly(filename, policy.Default().Settings, named)
	register(pol, cfg)
	return pol, nil
}

// Parser returns the parse function of a configuration file in either
// format (for sluice serve, check and simulate), which also returns the
// server's settings the file gives: sluice's own goes to
// policy.ParseConfig; the reference server's to ParseReferenceConfig, with
// the default server settings but for what the reference server's
// environment says, read through getenv (see ReadReferenceEnv: the store,
// the gRPC address and TLS, SHADOW_MODE and QUOTA_MODE, the response headers; a
// value sluice cannot honour is an error). So an existing deployment
// switches by pointing Envoy at sluice.
func Parser(getenv func(string) string) func(name string, data []byte) (*policy.Policy, serverconf.Settings, error) {
	return func(name string, data []byte) (*policy.Policy, serverconf.Settings, error) {
		if !IsReferenceConfig(data) {
			return policy.ParseConfig(name, data)
		}
		p, err := ParseReferenceConfig(name, data)
		if err != nil {
			return nil, serverconf.Settings{}, err
		}
		env, err := ReadReferenceEnv(getenv)
		if err != nil {
			return nil, serverconf.Settings{}, err
		}
		env.Modes.Apply(p)
		if env.Headers != nil {
			p.Settings.Headers = env.Headers
		}
		return p, env.Server(serverconf.Default()), nil
	}
}

// ReferenceEnv is the store URL and gRPC address of ReadReferenceEnv,
// "" for a variable that is unset or that it refuses.
func ReferenceEnv(getenv func(string) string) (storeURL, grpcAddr string) {
	env, _ := ReadReferenceEnv(getenv)
	return env.StoreURL, env.GRPCAddr
}

// ReferenceLimits describes a policy made by ParseReferenceConfig: its
// domains, sorted, and the limits it enforces, in file order (unlimited
// and zero-rate entries have none). ok is false for any other policy.
func ReferenceLimits(pol *policy.Policy) (domains []string, limits []*sluice.Limit, ok bool) {
	cfg := referenceOf(pol)
	if cfg == nil {
		return nil, nil, false
	}
	domains = slices.Sorted(maps.Keys(cfg.domains))
	for _, l := range cfg.limits {
		limits = append(limits, l.policyRule.Limit)
	}
	return domains, limits, true
}

// Match implements Matcher: each descriptor's own limit override, else
// the configured lookup; then every limit named in another found limit's
// replaces is dropped. A limit of requests_per_unit 0 blocks its
// descriptor; an unlimited one lets it through.
func (cfg *Reference) Match(req *rlspb.RateLimitRequest, found []Found) error {
	return cfg.matchInto(req, &scratch{found: found})
}

// matchInto is Match into sc.found, with sc's buffers: the limits of
// every descriptor share sc.ms.
func (cfg *Reference) matchInto(req *rlspb.RateLimitRequest, sc *scratch) error {
	var refBuf [8]*refLimit
	refs := refBuf[:0]
	if len(req.Descriptors) > len(refBuf) {
		refs = make([]*refLimit, 0, len(req.Descriptors))
	}
	refs = cfg.limitsFor(req, refs)
	found := sc.found
	for i, l := range refs {
		switch {
		case l == nil:
			// QUOTA_MODE makes a descriptor with no limit a quota
			// descriptor that passes (the reference's overall code counts
			// every descriptor but the unlimited ones).
			found[i] = Found{Quota: cfg.modes.Quota}
		case l.unlimited:
			found[i] = Found{Unlimited: true}
		case l.rpu == 0:
			found[i] = Found{Blocked: true, Shadow: l.shadow, Window: l.period(), Limit: l.currentLimit(), Quota: l.quota || cfg.modes.Quota}
		default:
			sc.ms = append(sc.ms, policy.Match{Rule: l.policyRule, Request: sluice.Request{Limit: l.policyRule.Limit, Key: refKey(req.Descriptors[i], l)}})
			n := len(sc.ms)
			found[i] = Found{Limits: sc.ms[n-1 : n : n], Limit: l.currentLimit(), Quota: l.quota || cfg.modes.Quota}
		}
	}
	return nil
}

// limitsFor appends to out the limit of each descriptor of req as the
// reference server finds it: a descriptor's own limit override, else the
// configured lookup; then every limit named in another found limit's
// replaces is dropped.
func (cfg *Reference) limitsFor(req *rlspb.RateLimitRequest, out []*refLimit) []*refLimit {
	var replaced map[string]bool
	for _, d := range req.Descriptors {
		var l *refLimit
		if d.Limit != nil {
			l = cfg.override(req.Domain, d.Limit)
		} else {
			l = cfg.lookup(req.Domain, d.Entries)
		}
		out = append(out, l)
		if l != nil && len(l.replaces) > 0 {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			for _, n := range l.replaces {
				replaced[n] = true
			}
		}
	}
	if replaced != nil {
		for i, l := range out {
			if l != nil && l.name != "" && replaced[l.name] {
				out[i] = nil
			}
		}
	}
	return out
}

// refKey is the bucket of d under l: the reference server counts per
// value of every entry, so the key is the whole descriptor (a wildcard
// with share_threshold counts every matching value together).
func refKey(d *rlv3.RateLimitDescriptor, l *refLimit) string {
	var b strings.Builder
	// The usual key (nothing to escape, no share) in one allocation.
	n := 0
	for _, en := range d.Entries {
		n += len(en.Key) + len(en.Value) + 2
	}
	b.Grow(n)
	for i, en := range d.Entries {
		if i > 0 {
			b.WriteByte('|')
		}
		v := policy.DescriptorValue(en.Key, en.Value, refIPv6Prefix)
		if i < len(l.share) && l.share[i] != "" {
			v = l.share[i]
		}
		b.WriteString(keyComponent(en.Key))
		b.WriteByte('=')
		b.WriteString(keyComponent(v))
	}
	return b.String()
}

// refIPv6Prefix groups IPv6 clients in keys (policy.DescriptorValue) as
// ipv6_prefix does by default: the reference format sets none.
var refIPv6Prefix = policy.DefaultSettings().IPv6Prefix

// keyComponent escapes one key part so that no value can forge another
// entry, a Redis Cluster hash tag or another limit's key; long parts are
// hashed so that keys stay bounded.
func keyComponent(s string) string {
	const hexd = "0123456789ABCDEF"
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= 0x20 || c >= 0x7f || strings.IndexByte("%|:={}()#", c) >= 0 {
			if b == nil {
				b = append(make([]byte, 0, len(s)+8), s[:i]...)
			}
			b = append(b, '%', hexd[c>>4], hexd[c&15])
		} else if b != nil {
			b = append(b, c)
		}
	}
	if b != nil {
		s = string(b)
	}
	if len(s) > 128 {
		sum := sha256.Sum256([]byte(s))
		return "#" + hex.EncodeToString(sum[:])
	}
	return s
}

// override is a limit a descriptor brings along (RateLimitOverride),
// which the reference server applies instead of the configured one.
func (cfg *Reference) override(domain string, o *rlv3.RateLimitDescriptor_RateLimitOverride) *refLimit {
	unit := rlspb.RateLimitResponse_RateLimit_Unit(o.Unit)
	if unitLength(unit) == 0 || cfg.domains[domain] == nil {
		return nil
	}
	k := overrideKey{domain, o.RequestsPerUnit, unit}
	cfg.overMu.Lock()
	defer cfg.overMu.Unlock()
	if l, ok := cfg.overrides[k]; ok {
		return l
	}
	l := &refLimit{rpu: o.RequestsPerUnit, unit: unit, multiplier: 1}
	if l.rpu > 0 {
		// Counted per domain and rate, as the reference server counts (no chain of the file starts
		// with two NULs), but reported per domain and unit: every rule name is a series kept for good.
		l.rule = overrideID(domain, "override."+strings.ToLower(unit.String()))
		lim, err := sluice.NewLimit(sluice.Spec{Name: overrideID(domain, fmt.Sprintf("override.%d.%s", l.rpu, strings.ToLower(unit.String()))), Algorithm: sluice.FixedWindow, Rate: float64(l.rpu), Period: l.period(), Start: new(time.Duration)})
		if err != nil {
			return nil
		}
		l.policyRule = &policy.Rule{Name: l.rule, Algorithm: sluice.FixedWindow, Mode: policy.EnforceMode, OnStoreError: policy.AllowOnError, Limit: lim}
	}
	if len(cfg.overrides) < maxOverrides {
		cfg.overrides[k] = l
	}
	return l
}

// overrideID is limitID for the chain "\x00\x00"+name, which no chain of
// a file starts with.
func overrideID(domain, name string) string {
	h := sha256.New()
	io.WriteString(h, strconv.Itoa(len(domain))+":"+domain+"\x00\x00"+name)
	return limitID(domain, name, h)
}

// maxOverrides bounds the compiled overrides kept; others are compiled
// per call.
const maxOverrides = 1024

type overrideKey struct {
	domain string
	rpu    uint32
	unit   rlspb.RateLimitResponse_RateLimit_Unit
}
