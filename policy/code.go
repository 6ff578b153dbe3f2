package policy

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// Policies written in code, without a file: what httpgate.LimitByIP and
// its siblings build, and what a program that keeps its limits in Go
// builds for httpgate.Middleware.

// CodeRule is a rule written in code: what one entry of a file's rules
// says, for the rules that need no tiers, match or cost_source. A request
// costs one token.
type CodeRule struct {
	// Limit is the rule's limit; the rule is named after it, and its name
	// is 1 to 64 of A-Z a-z 0-9 _ . - as a file's rule names are.
	Limit *sluice.Limit
	// LimitKeys pick the bucket, spelled as a file's limit_keys are:
	// "ip:address" (the client address, see Settings.TrustedProxies),
	// "header:X-API-Key", "query:NAME", "path", "method", "host". None
	// is one bucket shared by every request. jwt:CLAIM needs a jwt
	// section's verification keys, which only a file (Parse) gives.
	LimitKeys []string
	// Mode, OnStoreError and MissingKey are as in a file; their zero
	// values are a file's defaults: enforce, allow, shared.
	Mode         Mode
	OnStoreError OnStoreError
	MissingKey   MissingKey
}

// DefaultSettings returns the settings of a file that gives nothing but
// rules: no trusted proxies, headers draft and trio, IPv6 clients grouped
// by /64. FromRules takes them, changed where the program needs to.
func DefaultSettings() Settings { return newPolicy("").Settings }

// FromRules compiles rules written in code into a policy with settings
// s (start from DefaultSettings): the policy Parse makes of a file
// holding those rules and settings. On failure the error is a *Errors
// whose items name the rule ("rules[1].limit_keys[0]: ...").
func FromRules(s Settings, rules ...CodeRule) (*Policy, error) {
	p := newPolicy("code")
	p.Settings = s
	var errs []error
	bad := func(path, format string, a ...any) {
		errs = append(errs, &Error{Path: path, Msg: fmt.Sprintf(format, a...)})
	}
	if s.IPv6Prefix < 1 || s.IPv6Prefix > 128 {
		bad("IPv6Prefix", "must be between 1 and 128 (got %d): start from DefaultSettings", s.IPv6Prefix)
	}
	p.Settings.TrustedProxies = slices.Clone(s.TrustedProxies)
	for i, pr := range p.Settings.TrustedProxies {
		var msg string
		if p.Settings.TrustedProxies[i], msg = trustedPrefix(pr.Masked(), pr.String()); msg != "" {
			bad(fmt.Sprintf("TrustedProxies[%d]", i), "%s", msg)
		}
	}
	if s.ClientHeader == "" {
		p.Settings.ClientHeader = "X-Forwarded-For" // as in a file without client_header
	} else if msg := checkClientHeader(s.ClientHeader); msg != "" {
		bad("ClientHeader", "%s", msg)
	} else {
		p.Settings.ClientHeader = http.CanonicalHeaderKey(s.ClientHeader)
	}
	if len(s.Headers) == 0 {
		bad("Headers", "must name at least one header set (draft, trio, legacy), or none: start from DefaultSettings")
	}
	for i, h := range s.Headers {
		if !slices.Contains([]string{"draft", "trio", "legacy", "none"}, h) {
			bad(fmt.Sprintf("Headers[%d]", i), "unknown header set %q (want draft, trio, legacy or none)", h)
		}
	}
	if len(rules) == 0 {
		bad("rules", "must hold at least one rule")
	}
	for i, cr := range rules {
		path := fmt.Sprintf("rules[%d]", i)
		if cr.Limit == nil {
			bad(path, "has no limit")
			continue
		}
		name := cr.Limit.Name()
		switch {
		case !validName(name):
			bad(path, "limit name %q must be 1 to 64 of A-Z a-z 0-9 _ . -", name)
			continue
		case p.byName[name] != nil:
			bad(path, "limit name %q is used twice; their buckets would be shared", name)
			continue
		}
		r := &Rule{Name: name, Mode: cr.Mode, OnStoreError: cr.OnStoreError, MissingKey: cr.MissingKey,
			Limit: cr.Limit, Algorithm: cr.Limit.Algorithm()}
		seen := map[string]bool{}
		for j, k := range cr.LimitKeys {
			kp := fmt.Sprintf("%s.limit_keys[%d]", path, j)
			src, msg := parseSource(k, false)
			switch {
			case msg != "":
				bad(kp, "%s", msg)
			case src.kind == srcJWT:
				bad(kp, "%q reads a JWT claim, which needs a jwt section's verification keys: write the policy as a file (policy.Parse)", k)
			case seen[src.text]:
				bad(kp, "%q is listed twice", k)
			default:
				seen[src.text] = true
				r.keys = append(r.keys, src)
				r.LimitKeys = append(r.LimitKeys, k)
			}
		}
		// The cost every request of the rule is charged: one token, which
		// a limit below one token could never admit.
		if _, err := (sluice.Request{Limit: cr.Limit, Cost: 1}).Charged(engine.OpTake); err != nil {
			bad(path, "a request costs 1 token: %v", err)
			continue
		}
		r.own = &variant{limit: cr.Limit, cost: costSpec{fixed: 1, def: 1, min: 1}}
		p.byName[name] = r
		p.limits[name] = namedLimit{cr.Limit, r}
		p.Rules = append(p.Rules, r)
	}
	if len(errs) > 0 {
		return nil, &Errors{List: errs}
	}
	return p, nil
}
