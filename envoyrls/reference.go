package envoyrls

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/policy"
)

// The reference server's file format, as envoyproxy/ratelimit reads it.
// Each YAML document is one domain; several documents (separated by ---)
// configure several domains, the way the reference server reads one file per
// domain from its runtime directory.
type refRoot struct {
	Domain      string          `yaml:"domain"`
	Descriptors []refDescriptor `yaml:"descriptors"`
}

type refDescriptor struct {
	Key            string          `yaml:"key"`
	Value          string          `yaml:"value"`
	RateLimit      *refRateLimit   `yaml:"rate_limit"`
	Descriptors    []refDescriptor `yaml:"descriptors"`
	ShadowMode     bool            `yaml:"shadow_mode"`
	DetailedMetric bool            `yaml:"detailed_metric"`
	ValueToMetric  bool            `yaml:"value_to_metric"`
	ShareThreshold bool            `yaml:"share_threshold"`
	QuotaMode      bool            `yaml:"quota_mode"`
}

type refRateLimit struct {
	RequestsPerUnit *uint32      `yaml:"requests_per_unit"`
	Unit            string       `yaml:"unit"`
	UnitMultiplier  *uint32      `yaml:"unit_multiplier"`
	Unlimited       bool         `yaml:"unlimited"`
	Name            string       `yaml:"name"`
	Replaces        []refReplace `yaml:"replaces"`
}

type refReplace struct {
	Name string `yaml:"name"`
}

// refLimit is one rate_limit of the file, compiled.
type refLimit struct {
	rule       string // the sluice rule that enforces it ("" when unlimited or zero)
	name       string // rate_limit.name, "" when unnamed
	path       string // where it is in its domain, for messages (not the domain: a long one would be kept once per limit)
	rpu        uint32
	unit       rlspb.RateLimitResponse_RateLimit_Unit
	multiplier uint32
	unlimited  bool
	shadow     bool
	quota      bool   // quota_mode (see Found.Quota)
	id         string // the name its buckets are kept under (limitID)
	replaces   []string
	share      []string // per entry, the wildcard value all its matches count as (share_threshold), or ""
	policyRule *policy.Rule

	clOnce sync.Once
	cl     *rlspb.RateLimitResponse_RateLimit
}

// period is the limit's window, unit x unit_multiplier, at most 2^52 µs
// (some 142 years, which every store counts exactly; the reference's
// longer windows are forever in effect), never a product wrapped around.
func (l *refLimit) period() time.Duration {
	if u, n := unitLength(l.unit), time.Duration(max(l.multiplier, 1)); u == 0 || n <= (1<<52)*time.Microsecond/u {
		return u * n
	}
	return (1 << 52) * time.Microsecond
}

// currentLimit is the limit as the reference server reports it, made
// once and shared by every response (only ever read).
func (l *refLimit) currentLimit() *rlspb.RateLimitResponse_RateLimit {
	l.clOnce.Do(func() {
		l.cl = &rlspb.RateLimitResponse_RateLimit{Name: l.name, RequestsPerUnit: l.rpu, Unit: l.unit}
		if l.multiplier > 1 {
			l.cl.UnitMultiplier = wrapperspb.UInt32(l.multiplier)
		}
	})
	return l.cl
}

// refNode is one descriptor of the tree.
type refNode struct {
	limit *refLimit
	// children by "key_value" (exact) and "key" (any value);
	// wildcards ("key_val*ue*") are tried in file order.
	children  map[string]*refNode
	wildcards []refWildcard
}

type refWildcard struct {
	parts []string // "key_value" cut at each star
	node  *refNode
}

// matches reports whether s is w's parts in order with anything between
// them, as the reference server matches a star anywhere in a value.
func (w refWildcard) matches(s string) bool {
	last := len(w.parts) - 1
	rest, ok := strings.CutPrefix(s, w.parts[0])
	for i := 1; ok && i < last; i++ {
		_, rest, ok = strings.Cut(rest, w.parts[i])
	}
	return ok && strings.HasSuffix(rest, w.parts[last])
}

// Reference is a file in the reference server's format, compiled: one
// tree of descriptors per domain. It is the Matcher of a policy that
// ParseReferenceConfig returns, and finds the limits of a call as the
// reference server does (see the package documentation). It is safe for
// concurrent use.
type Reference struct {
	domains map[string]*refNode
	limits  []*refLimit // every rate_limit with requests_per_unit > 0, in file order

	overMu    sync.Mutex
	overrides map[overrideKey]*refLimit

	// modes are the reference server's global modes (SHADOW_MODE,
	// QUOTA_MODE) this configuration is served with.
	modes Modes
}

// refError collects located problems.
type refError struct {
	file  string
	list  []string
	lines []int
}

func (e *refError) add(line int, path, format string, a ...any) {
	loc := e.file
	if line > 0 {
		loc += ":" + strconv.Itoa(line)
	}
	msg := fmt.Sprintf(format, a...)
	if path != "" {
		msg = path + ": " + msg
	}
	e.list = append(e.list, loc+": "+msg)
	e.lines = append(e.lines, line)
}

// A refError sorts its problems by line (sort.Stable), as a reader goes
// through the file.
func (e *refError) Len() int           { return len(e.list) }
func (e *refError) Less(a, b int) bool { return e.lines[a] < e.lines[b] }
func (e *refError) Swap(a, b int) {
	e.list[a], e.list[b], e.lines[a], e.lines[b] = e.list[b], e.list[a], e.lines[b], e.lines[a]
}

// addYAML reports a decoding error, each of a TypeError's problems at its
// own line.
func (e *refError) addYAML(line int, err error) {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		e.add(line, "", "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		return
	}
	for _, m := range te.Errors {
		l := line
		if rest, ok := strings.CutPrefix(m, "line "); ok {
			if n, msg, ok := strings.Cut(rest, ": "); ok {
				if v, err := strconv.Atoi(n); err == nil {
					l, m = v, msg
				}
			}
		}
		e.add(l, "", "%s", m)
	}
}

func (e *refError) Error() string { return strings.Join(e.list, "\n") }

var knownRefKeys = map[string]bool{
	"domain": true, "descriptors": true, "key": true, "value": true, "rate_limit": true,
	"shadow_mode": true, "detailed_metric": true, "value_to_metric": true, "share_threshold": true,
	"requests_per_unit": true, "unit": true, "unit_multiplier": true, "unlimited": true,
	"name": true, "replaces": true, "quota_mode": true,
}

// maxRefPath bounds the path of a node of a file that its checks
// descend to, far beyond the deepest a call reaches: each level copies
// its parent's path, so that a file nested thousands deep would be
// checked in the square of its size.
const maxRefPath = 2048

// checkKeys reports keys the reference server does not know: it refuses
// them too, and a misspelt "shadow_mode" must not silently enforce.
func checkKeys(n *yaml.Node, path string, e *refError) {
	if len(path) > maxRefPath {
		e.add(n.Line, "", "nested too deep: no call's descriptor has more than %d entries", maxEntries)
		return
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if !knownRefKeys[k.Value] {
				e.add(k.Line, path, "unknown key %q", k.Value)
				continue
			}
			checkKeys(n.Content[i+1], strings.TrimPrefix(path+"."+k.Value, "."), e) // no known key starts with "."
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			checkKeys(c, fmt.Sprintf("%s[%d]", path, i), e)
		}
	}
}

// parseReference reads and validates a reference-format file.
func parseReference(filename string, data []byte) (*Reference, error) {
	e := &refError{file: filename}
	cfg := &Reference{domains: map[string]*refNode{}, overrides: map[overrideKey]*refLimit{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for doc := 0; ; doc++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			if doc == 0 {
				e.add(0, "domain", "the file is empty")
			}
			break
		}
		if err != nil {
			e.addYAML(0, err)
			break
		}
		if len(n.Content) == 0 {
			continue
		}
		root := n.Content[0]
		checkKeys(root, "", e)
		var r refRoot
		if err := root.Decode(&r); err != nil {
			e.addYAML(root.Line, err)
			var te *yaml.TypeError
			if !errors.As(err, &te) {
				continue
			}
			// The rest decoded: check it too, so one run shows every problem.
		}
		cfg.addDomain(e, r, root.Line, descriptorLines(root))
	}
	if len(e.list) > 0 {
		sort.Stable(e)
		return nil, e
	}
	return cfg, nil
}

// addDomain compiles one domain into cfg; line and lines locate it in
// its file for messages (0 and nil when it has no lines, as an xDS
// resource).
func (cfg *Reference) addDomain(e *refError, r refRoot, line int, lines map[string]int) {
	if r.Domain == "" {
		e.add(line, "domain", "must not be empty")
		return
	}
	if _, dup := cfg.domains[r.Domain]; dup {
		e.add(line, "domain", "duplicate domain %q", r.Domain)
		return
	}
	top := &refNode{}
	cfg.domains[r.Domain] = top
	root := sha256.New() // the domain length-prefixed, so that no domain's chain reads as another's
	io.WriteString(root, strconv.Itoa(len(r.Domain))+":"+r.Domain)
	cfg.load(e, r.Domain, top, r.Descriptors, "descriptors", root, nil, lines)
}

// descriptorLines maps each descriptor's path to its line, so messages
// can point into the file.
func descriptorLines(root *yaml.Node) map[string]int {
	out := map[string]int{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		if n.Kind != yaml.MappingNode || len(path) > maxRefPath {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := path + "." + k.Value
			if path == "" {
				p = k.Value
			}
			out[p] = k.Line
			if k.Value == "descriptors" && v.Kind == yaml.SequenceNode {
				for j, c := range v.Content {
					cp := fmt.Sprintf("%s[%d]", p, j)
					out[cp] = c.Line
					walk(c, cp)
				}
			} else {
				walk(v, p)
			}
		}
	}
	walk(root, "")
	return out
}

// load compiles ds under parent; path is where they are in the file (for
// messages), chain the hash of the keys and values that lead to them (for the
// limits' identity, see chainOf), share what each of those entries
// counts as (refLimit.share).
func (cfg *Reference) load(e *refError, domain string, parent *refNode, ds []refDescriptor, path string, chain hash.Hash, share []string, lines map[string]int) {
	if len(share) >= maxEntries {
		// No call reaches them, and each level copies its ancestors' path
		// and shares: deep nesting would compile to the square of its size.
		e.add(lines[path], path, "nested deeper than %d levels, the most entries a call's descriptor may have", maxEntries)
		return
	}
	parent.children = map[string]*refNode{}
	for i, d := range ds {
		p := fmt.Sprintf("%s[%d]", path, i)
		line := lines[p]
		if d.Key == "" {
			e.add(line, p+".key", "must not be empty")
			continue
		}
		final := d.Key
		if d.Value != "" {
			final += "_" + d.Value
		}
		if _, dup := parent.children[final]; dup {
			e.add(line, p, "duplicate descriptor composite key %q", final)
			continue
		}
		n := &refNode{}
		parent.children[final] = n
		if strings.Contains(final, "*") {
			parent.wildcards = append(parent.wildcards, refWildcard{strings.Split(final, "*"), n})
		}
		c, sh := chainOf(chain, final), append(share[:len(share):len(share)], "")
		if d.ShareThreshold {
			// As the reference server's: whether or not the limit is this
			// descriptor's own, every value matching it counts as one.
			if !strings.Contains(final, "*") {
				e.add(line, p+".share_threshold", "applies to wildcard values (holding a \"*\") only")
			}
			sh[len(sh)-1] = d.Value
		}
		if rl := d.RateLimit; rl != nil {
			n.limit = cfg.compileLimit(e, domain, d, p, final, c, lines)
			n.limit.share = sh
		}
		if len(d.Descriptors) > 0 {
			cfg.load(e, domain, n, d.Descriptors, p+".descriptors", c, sh, lines)
		}
	}
}

func (cfg *Reference) compileLimit(e *refError, domain string, d refDescriptor, p, last string, chain hash.Hash, lines map[string]int) *refLimit {
	rl := d.RateLimit
	rp := p + ".rate_limit"
	line := lines[rp]
	l := &refLimit{name: rl.Name, path: p, unlimited: rl.Unlimited, shadow: d.ShadowMode, quota: d.QuotaMode, id: limitID(domain, last, chain)}
	if rl.UnitMultiplier != nil {
		l.multiplier = *rl.UnitMultiplier
		if l.multiplier == 0 {
			e.add(lines[rp+".unit_multiplier"], rp+".unit_multiplier", "must be at least 1")
		}
	}
	for j, r := range rl.Replaces {
		if r.Name == "" {
			e.add(line, fmt.Sprintf("%s.replaces[%d].name", rp, j), "must not be empty")
			continue
		}
		l.replaces = append(l.replaces, r.Name)
	}
	unit, known := rlspb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(rl.Unit)]
	l.unit = rlspb.RateLimitResponse_RateLimit_Unit(unit)
	switch {
	case rl.Unlimited:
		if known && l.unit != rlspb.RateLimitResponse_RateLimit_UNKNOWN {
			e.add(lines[rp+".unit"], rp+".unit", "should not specify rate limit unit when unlimited")
		}
		return l
	case !known || l.unit == rlspb.RateLimitResponse_RateLimit_UNKNOWN:
		e.add(lines[rp+".unit"], rp+".unit", "invalid rate limit unit %q (want second, minute, hour, day, week, month or year)", rl.Unit)
		return l
	}
	for _, r := range l.replaces {
		if r == rl.Name {
			e.add(line, rp+".replaces", "should not contain name of same descriptor (%q)", r)
		}
	}
	if rl.RequestsPerUnit != nil {
		l.rpu = *rl.RequestsPerUnit // absent is 0, as in the reference server: every request is over the limit
	}
	if l.rpu > 0 {
		l.rule = l.id
		cfg.limits = append(cfg.limits, l)
	}
	return l
}

// limitID names the buckets of the limit that the descriptors of chain
// (see chainOf), the last of them last, reach in domain: the same wherever
// the limit sits in its file or among a control plane's resources, and
// whatever its rate, so that a reload that moves, adds or removes other
// limits, or changes this one's rate, keeps its buckets (which the rule's
// index-based name, envoy.DOMAIN.N, would not). The hash keeps it within
// a limit name's bounds and free of the characters domains may hold; it
// alone tells apart domains that read alike, so 64 bits, not 32, whose
// collisions a second's search finds (TestAttackDomainsShareLimitName).
func limitID(domain, last string, chain hash.Hash) string {
	// The last key names the limit for a reader ("remote_address").
	return "envoy." + safePrefix(domain, 20) + "." + safePrefix(last, 24) + "." + hex.EncodeToString(chain.Sum(nil)[:8])
}

// chainOf is chain, the hash of a length-prefixed domain and of the "\x00key" or
// "\x00key_value" of each descriptor leading to one, with final's after
// it. A descriptor extends its parent's hash rather than hashing its
// path again: a long key above many descriptors is read once, not once
// for each.
func chainOf(chain hash.Hash, final string) hash.Hash {
	h, _ := chain.(hash.Cloner).Clone() // a sha256 always clones
	io.WriteString(h, "\x00"+final)
	return h
}

// safePrefix is s's first n runes as a rule name may hold them: each
// letter, digit, '_', '.' or '-' as it is, any other rune as '_'. It
// reads no more of s than that, and needs no regexp, whose matcher
// allocates in proportion to its input when its pool is empty.
func safePrefix(s string, n int) string {
	b := make([]byte, 0, n)
	for _, r := range s {
		if len(b) == n {
			break
		}
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-' {
			b = append(b, byte(r))
		} else {
			b = append(b, '_')
		}
	}
	return string(b)
}

// lookup finds the limit for one descriptor the way the reference server
// does: walk the entries in order, at each level preferring the exact
// "key_value", then the first wildcard "key_va*ue*" that matches, then the
// bare "key" (any value); the limit applies only when the node reached by
// the last entry has one.
func (cfg *Reference) lookup(domain string, entries []*rlv3.RateLimitDescriptor_Entry) *refLimit {
	n := cfg.domains[domain]
	if n == nil {
		return nil
	}
	var found *refLimit
	for i, en := range entries {
		final := en.Key + "_" + en.Value
		next := n.children[final]
		if next == nil {
			for _, w := range n.wildcards {
				if w.matches(final) {
					next = w.node
					break
				}
			}
		}
		if next == nil {
			next = n.children[en.Key]
		}
		if next == nil {
			return nil
		}
		if i == len(entries)-1 {
			found = next.limit
		}
		if len(next.children) == 0 {
			break
		}
		n = next
	}
	return found
}

// clampU32 converts a count to the protocol's uint32, saturating.
func clampU32(v int64) uint32 { return uint32(min(max(v, 0), math.MaxUint32)) }
