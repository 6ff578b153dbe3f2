package policy

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
)

// Limits by name: what the decision API (/v1/take, /v1/peek, /v1/reset)
// and sluice simulate accept, and what they say when a name is unknown.

// NamedRule is a rule reachable by name only (see NameOnly), with the
// name its file gives it, if any.
type NamedRule struct {
	Rule *Rule
	// Alias is the file's own name for the limit ("per-address"), which
	// FindLimit accepts beside Rule.Name; "" when it has none.
	Alias string
}

// NameOnly returns a policy with settings whose rules apply to no
// request (Match never finds them) but are reachable by name: FindLimit
// resolves each rule's Name and its Alias. A file of another format
// (envoyproxy/ratelimit's, whose limits apply to Envoy descriptors only)
// is compiled to one, so that the decision API and sluice simulate reach
// its limits under the names the file gives them.
func NameOnly(source string, settings Settings, rules []NamedRule) *Policy {
	p := &Policy{Source: source, Settings: settings, named: rules, byAlias: map[string][]*Rule{}, namedBy: map[string]*Rule{}}
	for _, nr := range rules {
		p.namedBy[nr.Rule.Name] = nr.Rule
	}
	for _, nr := range rules {
		if _, taken := p.namedBy[nr.Alias]; nr.Alias != "" && !taken {
			p.byAlias[nr.Alias] = append(p.byAlias[nr.Alias], nr.Rule)
		}
	}
	return p
}

// maxListed bounds the limits an unknown name's error lists: a policy
// may have thousands, and the error goes to a client.
const maxListed = 20

// LimitName returns name as the policy holds it when it names a rule's
// own limit or a tier's (FindLimit's first reading), or "" otherwise: a
// caller holding the name as bytes gets the string without making one.
func (p *Policy) LimitName(name []byte) string {
	if lim := p.limits[string(name)].lim; lim != nil && lim.Name() == string(name) {
		return lim.Name()
	}
	return ""
}

// FindLimit resolves a limit's name as the decision API, reset and sluice
// simulate take it: a rule's own limit ("per-ip"), a tier's ("RULE.TIER"),
// or a name-only rule's name or alias (see NameOnly). It returns the rule
// that owns the limit. An unknown name's error suggests the closest name
// and lists the first of them (see ListLimits).
func (p *Policy) FindLimit(name string) (*Rule, *sluice.Limit, error) {
	if nl := p.limits[name]; nl.lim != nil {
		return nl.rule, nl.lim, nil
	}
	if r := p.byName[name]; r != nil && len(r.Tiers) > 0 {
		names := make([]string, len(r.Tiers))
		for i, t := range r.Tiers {
			names[i] = t.Limit.Name()
		}
		return nil, nil, fmt.Errorf("rule %q has tiers and no limit of its own: name a tier (%s)", name, strings.Join(names, ", "))
	}
	if r := p.namedBy[name]; r != nil {
		return r, r.Limit, nil
	}
	if rs := p.byAlias[name]; len(rs) == 1 {
		return rs[0], rs[0].Limit, nil
	} else if len(rs) > 1 {
		names := make([]string, len(rs))
		for i, r := range rs {
			names[i] = r.Name
		}
		return nil, nil, fmt.Errorf("%q names %d limits of the file: name one of %s", name, len(rs), strings.Join(names, ", "))
	}
	// The name is the client's: only its start is repeated.
	msg := "unknown rule " + strconv.Quote(clip(name))
	if s := Suggest(name, p.acceptedNames()); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	if list := p.ListLimits(); list != "" {
		return nil, nil, fmt.Errorf("%s; the limits are: %s", msg, list)
	}
	return nil, nil, fmt.Errorf("%s: the policy has no limits", msg)
}

// NamedRules returns the name-only rules (see NameOnly), in file order.
func (p *Policy) NamedRules() []NamedRule { return p.named }

// NamedLimits returns every limit FindLimit resolves, in file order: the
// rules' own and their tiers' (Limits), then the name-only rules'.
func (p *Policy) NamedLimits() []*sluice.Limit {
	out := p.Limits()
	for _, nr := range p.named {
		out = append(out, nr.Rule.Limit)
	}
	return out
}

// ListLimits lists the first names FindLimit resolves, for people: a
// name-only rule's alias follows its name ("envoy.edge.remote_address.b8139932fb309819 (per-address)"),
// and beyond the first 20 the rest are counted. "" when there are none.
func (p *Policy) ListLimits() string {
	var b strings.Builder
	n := 0
	add := func(s string) {
		if n < maxListed {
			if n > 0 {
				b.WriteString(", ")
			}
			b.WriteString(s)
		}
		n++
	}
	for _, lim := range p.Limits() {
		add(lim.Name())
	}
	for _, nr := range p.named {
		if nr.Alias != "" {
			add(nr.Rule.Name + " (" + nr.Alias + ")")
		} else {
			add(nr.Rule.Name)
		}
	}
	if n > maxListed {
		fmt.Fprintf(&b, " and %d more", n-maxListed)
	}
	return b.String()
}

// acceptedNames lists every name FindLimit accepts, for suggestions.
func (p *Policy) acceptedNames() []string {
	var out []string
	for _, lim := range p.Limits() {
		out = append(out, lim.Name())
	}
	for _, nr := range p.named {
		out = append(out, nr.Rule.Name)
		if nr.Alias != "" {
			out = append(out, nr.Alias)
		}
	}
	return out
}
