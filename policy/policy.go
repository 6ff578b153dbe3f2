// Package policy turns a sluice configuration file (YAML or JSON, one
// schema) into compiled rules, builds each rule's bucket key from a
// request, and enforces the rules that apply to a request all-or-nothing.
//
// Load and Parse validate the whole file and report every problem at once,
// each located as FILE:LINE: path: message. A Policy is immutable once
// loaded and safe for concurrent use. FromRules builds one from rules
// written in code.
//
// The request-shaped paths (forward auth, reverse proxy, Envoy, the Go
// middleware) describe the request as an Input (FromHTTP), ask Match for
// the limits that apply and pass them to Enforce. The decision API, which
// names a rule and brings its own key, builds the Match itself from
// Rule.Limit (or Policy.Limit for a tier), so shadow mode and
// on_store_error behave the same on both shapes.
//
// What a client is told about a Verdict is decided here too, for every
// transport alike: AppendFields (the RateLimit fields, Retry-After,
// X-Sluice-Reason), Result.Reason and Verdict.Reason, Result.Effective
// and Verdict.Violations. httpgate writes them as http.Header and
// problem+json, envoyrls as Envoy's response_headers_to_add.
//
// Where things are: policy.go holds the compiled types; load.go Load,
// Parse and the top-level schema (each field, its default, one function
// per section); load_rule.go the rules with their tiers, match,
// algorithm_config and costs; load_server.go the server's sections
// (listeners, store, server, grpc, grpc_tls), read into a
// serverconf.Settings that ParseConfig returns beside the policy; the
// other sections are read in the file named after them (jwt.go,
// forwardauth.go, rulestable.go); yamlnode.go is the schema-free plumbing (typed field
// readers, "did you mean", FILE:LINE errors); settle.go settle_from,
// body:PATH costs and settle_secret_env. request.go and query.go
// read a request's key parts, match.go its conditions and costs, and
// enforce.go decides;
// response.go says what a client is told. watch.go keeps a running policy
// in step with where it comes from: a Source (a File, or a file merged
// with PostgreSQL's rules table), reloaded by Watch, which keeps the last
// good policy when a reload is refused.
package policy

import (
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/quota"
	"github.com/sluicehq/sluice/settle"
)

// Policy is a loaded, validated configuration.
type Policy struct {
	// Source is the file the policy was loaded from, or "embedded default".
	Source string
	// Settings are the non-rule settings, for wiring.
	Settings Settings
	// Rules in file order.
	Rules []*Rule
	// Warnings are settings that load but deserve a second look (a plan
	// read from a header any client can send, forward_auth without
	// trusted_proxies), each as "FILE:LINE: path: message". sluice check
	// prints them; serve logs them.
	Warnings []string
	// Notes say what settings work out to, such as the burst that
	// burst_seconds gives, each as "FILE:LINE: path: message". sluice
	// check prints them.
	Notes []string

	// digest identifies what the policy was compiled from (its file, and
	// the variables and key files that file names), so that a reload of
	// the same inputs is known as no change; zero for a policy not parsed
	// from a file.
	digest [32]byte

	jwt    claimsVerifier
	byName map[string]*Rule
	limits map[string]namedLimit

	readsBody     bool     // ReadsBody
	settleHeaders []string // SettleHeaders

	// Rules reachable by name only (NameOnly), by name and by alias.
	named   []NamedRule
	namedBy map[string]*Rule
	byAlias map[string][]*Rule
}

// Settings are a policy's top-level settings besides its rules: what a
// request is told and how it is read. The server's own settings (its
// listeners, store and their bounds) are package serverconf's.
type Settings struct {
	// AdminTokenEnv names the environment variable holding the admin token
	// for /v1/reset ("" = reset disabled).
	AdminTokenEnv string
	// Headers are the response header sets: any of "draft", "trio",
	// "legacy", or "none" alone (default ["draft", "trio"]).
	Headers []string
	// DenyStatus is the status of a forward-auth rejection (default 429;
	// 403 for nginx auth_request).
	DenyStatus int
	// AuditLog is the path of the JSON-lines audit log of rejections
	// ("" = off).
	AuditLog string

	// TrustedProxies are the peers whose ClientHeader (and, on forward
	// auth, ForwardAuth's headers) are believed.
	TrustedProxies []netip.Prefix
	// ClientHeader names the one header in which the trusted proxies state
	// the client's address (client_header; default X-Forwarded-For):
	// Forwarded (its for= parameters) or a comma-separated list of
	// addresses, walked from the right past trusted_proxies. No other
	// header is read. A proxy passes on the forwarding headers it does not
	// write itself, so a second header read beside it (X-Forwarded-For
	// behind a proxy that writes Forwarded) would be the client's to fill.
	ClientHeader string
	// IPv6Prefix is the prefix length IPv6 clients are grouped by in
	// ip:address keys (default 64).
	IPv6Prefix int
	// MissingKey is the default for rules whose key source is absent.
	MissingKey MissingKey
	// RulesTable says where the rules kept in PostgreSQL find a request's
	// plan and user.
	RulesTable RulesTable

	// AllowNegativeHits lets Envoy callers give hits back
	// (is_negative_hits); without it such a call is refused (default false).
	AllowNegativeHits bool

	// APITokenEnv names the environment variable holding the token that
	// /v1/take, /v1/peek and /v1/auth require ("" = none required).
	APITokenEnv string
	// ForwardAuth names the front proxy that calls /v1/auth, and so the
	// headers that describe the original request; the zero value believes
	// none.
	ForwardAuth ForwardAuth

	// UI is the ui section: what the live page (/ui) and /v1/stats show.
	UI UI
	// SettleSecretEnv names the environment variable holding the key that
	// the decision API signs settlement handles with, so that every server
	// of a fleet accepts the others' ("" = a key of each process's own).
	SettleSecretEnv string
}

// UI is the ui section, the live page's settings.
type UI struct {
	// ShowKeys shows the hottest keys as they are (default true); false
	// shows each as a keyed hash, stable within one process, so that the
	// page shows how hot a key is without saying whose it is.
	ShowKeys bool
}

// RulesTable is the rules_table section: the sources of the identities
// that the rows of the PostgreSQL rules table (sluice_rules) limit. Each
// is a source as written in limit_keys ("jwt:plan", "header:X-Plan"), and
// "" when no source is trusted. With a jwt section, Plan defaults to
// jwt:plan and User to jwt:sub; without one, both default to "".
type RulesTable struct {
	// Plan picks a request's plan, which picks each key pattern's row.
	// With none, every request is of no plan.
	Plan string
	// User keys the buckets of user-scope rows. With none, a user-scope
	// row is refused: no client-sent value may stand for a user unless
	// the operator names it.
	User string
	// DefaultPlan is the plan of a request that has none, or one for which
	// a key pattern has no row: that pattern's row for DefaultPlan limits
	// it, else its NULL-plan row. "" when unset.
	DefaultPlan string
}

// ForwardAuth says which front proxy calls /v1/auth and which headers
// carry its description of the original request (forward_auth in the
// file). They are read only from a caller in trusted_proxies, and no other
// header is: a front proxy passes the client's own headers on, so a header
// it does not set itself is the client's to choose.
type ForwardAuth struct {
	// Proxy is nginx, traefik, caddy, envoy or custom; "" when the file
	// has no forward_auth.
	Proxy string
	// MethodHeader, URIHeader and HostHeader name the headers holding the
	// original method, request URI (path and query) and host (canonical
	// form). They are empty for envoy, whose ext_authz sends the original
	// method, path (after /v1/auth) and Host as the call's own. A
	// HostHeader of "Host" reads the call's own Host.
	MethodHeader, URIHeader, HostHeader string
	// ClientHeader names the header holding the client address: a
	// comma-separated list, walked from the right past trusted_proxies.
	ClientHeader string
}

// forwardAuthProxies are the headers each known front proxy sets on its
// forward-auth call (and overwrites when the client sent them too).
var forwardAuthProxies = map[string]ForwardAuth{
	// examples/nginx.conf: proxy_set_header for each.
	"nginx": {Proxy: "nginx", MethodHeader: "X-Original-Method", URIHeader: "X-Original-Uri", HostHeader: "X-Original-Host", ClientHeader: "X-Real-Ip"},
	// Traefik ForwardAuth (trustForwardHeader: false).
	"traefik": {Proxy: "traefik", MethodHeader: "X-Forwarded-Method", URIHeader: "X-Forwarded-Uri", HostHeader: "X-Forwarded-Host", ClientHeader: "X-Forwarded-For"},
	// Caddy forward_auth (2.5.1+, no trusted_proxies of its own, or
	// trusted ones that append to X-Forwarded-For).
	"caddy": {Proxy: "caddy", MethodHeader: "X-Forwarded-Method", URIHeader: "X-Forwarded-Uri", HostHeader: "X-Forwarded-Host", ClientHeader: "X-Forwarded-For"},
	// Envoy ext_authz http_service (path_prefix: /v1/auth), with
	// use_remote_address and x-forwarded-for in allowed_headers.
	"envoy": {Proxy: "envoy", ClientHeader: "X-Forwarded-For"},
}

// ForwardAuthProxies lists the values forward_auth.proxy takes.
var ForwardAuthProxies = []string{"nginx", "traefik", "caddy", "envoy", "custom"}

// nameOf is the name of v, a setting of two values: names[1] for the
// second, names[0] for any other.
func nameOf[T ~uint8](names [2]string, v T) string {
	if v == 1 {
		return names[1]
	}
	return names[0]
}

// The names of the two-valued settings' values in the policy file, by
// value: what String writes and the loader reads.
var (
	modeNames         = [2]string{"enforce", "shadow"}
	onStoreErrorNames = [2]string{"allow", "deny"}
	missingKeyNames   = [2]string{"shared", "skip"}
)

// Mode says whether a rule's rejections are enforced.
type Mode uint8

// The modes.
const (
	// EnforceMode rejects requests the rule rejects (the default). (The
	// function Enforce owns the shorter name.)
	EnforceMode Mode = iota
	// Shadow decides, counts and logs, but never rejects and emits no
	// headers.
	Shadow
)

func (m Mode) String() string { return nameOf(modeNames, m) }

// OnStoreError is what a rule does when the store fails.
type OnStoreError uint8

// The store error actions.
const (
	// AllowOnError admits the request, leaves state untouched and counts
	// the error (the default).
	AllowOnError OnStoreError = iota
	// DenyOnError rejects the request.
	DenyOnError
)

func (o OnStoreError) String() string { return nameOf(onStoreErrorNames, o) }

// MissingKey is what a rule does with a request whose limit_keys source is
// absent (no such header, no verified JWT claim, ...).
type MissingKey uint8

// The missing key behaviours.
const (
	// MissingShared puts every such request in one bucket per rule: the
	// absent component is replaced by AbsentMarker, which no present value
	// can produce. The default: an absent key never escapes the limit.
	MissingShared MissingKey = iota
	// MissingSkip makes the rule not apply to such a request.
	MissingSkip
)

func (m MissingKey) String() string { return nameOf(missingKeyNames, m) }

// AbsentMarker is the key component of an absent source under
// missing_key: shared.
const AbsentMarker = "(absent)"

// EmptyMarker is the key of a rule keyed by one value that the request
// sends empty (a header "X-Api-Key: "): a key of its own, apart from an
// absent one's, and never the empty key, which sluice.Limiter refuses
// (sluice.ErrNoKey). No value escapes to it: '(' and ')' are escaped.
const EmptyMarker = "(empty)"

// Rule is a compiled rule.
type Rule struct {
	Name         string
	Mode         Mode
	OnStoreError OnStoreError
	// Limit is the rule's own limit (named like the rule), used by
	// /v1/take. A tiered rule without an algorithm_config of its own has
	// none: Limit is then its last tier's limit, while Match applies no
	// limit of the rule to a request matching no tier.
	Limit *sluice.Limit
	// Tiers are tried in order; the first whose match holds decides. Each
	// has its own limit named "RULE.TIER".
	Tiers []*Tier
	// Algorithm counts for the rule and all its tiers.
	Algorithm sluice.Algorithm
	// LimitKeys are the key sources as written ("header:x-api-key").
	LimitKeys []string
	// MissingKey is shared or skip.
	MissingKey MissingKey
	// Line is where the rule starts in its file.
	Line int

	own   *variant // nil for a tiered rule without its own config
	keys  []source
	match []cond
}

// Tier is a compiled tier of a rule.
type Tier struct {
	// Name is unique within the rule.
	Name string
	// Limit is the tier's limit, named "RULE.TIER".
	Limit *sluice.Limit

	v     *variant
	match []cond
}

// variant is one limit of a rule (its own or a tier's) with the
// per-request settings of its algorithm_config.
type variant struct {
	limit   *sluice.Limit
	cost    costSpec
	reserve bool
	settle  *settle.Source // nil: the charge is final

	// adaptive, when set, moves the limit's rate (see package adaptive).
	adaptive *adaptive.Config
	// lease, when set, leases the limit (see package quota).
	lease *quota.Settings
	// adaptiveLine is where the adaptive block is, for warnings.
	adaptiveLine int
	// maxQueued bounds the requests held for this limit's turns in one
	// process (max_queued; 0: no bound but the listener's connections).
	maxQueued int
	// queueDelay is max_queue_delay (0: none given).
	queueDelay time.Duration
	// queueDebt is the debt, in tokens, that a turn within
	// max_queue_delay leaves (0: none given, or max_reserved is tighter):
	// each request's MaxReserved, so the store refuses a later turn in
	// the step that would have charged it.
	queueDebt float64

	// formatted is the limit's response fields, made on first use.
	formatted atomic.Pointer[limitFields]
}

// Rule returns the rule called name, or nil.
func (p *Policy) Rule(name string) *Rule { return p.byName[name] }

// Limit resolves a limit name: a rule's name for its Rule.Limit
// ("per-ip"), or "RULE.TIER" for a tier's limit ("api.enterprise"). It
// returns nil when there is no such limit.
func (p *Policy) Limit(name string) *sluice.Limit { return p.limits[name].lim }

// namedLimit is a limit of the policy's rules, own or a tier's, and the
// rule it belongs to.
type namedLimit struct {
	lim  *sluice.Limit
	rule *Rule
}

// Limits returns every compiled limit, the rules' own and their tiers', in
// file order.
func (p *Policy) Limits() []*sluice.Limit {
	var out []*sluice.Limit
	for _, r := range p.Rules {
		if r.own != nil || (len(r.Tiers) == 0 && r.Limit != nil) {
			out = append(out, r.Limit)
		}
		for _, t := range r.Tiers {
			out = append(out, t.Limit)
		}
	}
	return out
}

// TrustedProxy reports whether addr is inside trusted_proxies.
func (p *Policy) TrustedProxy(addr netip.Addr) bool {
	addr = addr.Unmap().WithZone("")
	for _, pr := range p.Settings.TrustedProxies {
		if pr.Contains(addr) {
			return true
		}
	}
	return false
}

// validName reports whether s is a valid rule or tier name.
func validName(s string) bool { return sluice.ValidName(s) }

// Errors is every problem found in a configuration file, in line order.
// Load and Parse return it as a *Errors; each item is an *Error.
type Errors struct{ List []error }

// Error lists the problems, one per line.
func (es *Errors) Error() string {
	lines := make([]string, len(es.List))
	for i, e := range es.List {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Error is one problem in a configuration file, located by file, line and
// path ("rules[2].algorithm_config.burst").
type Error struct {
	File string
	// Line is 1-based; 0 when the problem has no line (an unreadable file).
	Line int
	// Path names the field, "" for the whole file.
	Path string
	Msg  string
}

// Error formats e as "FILE:LINE: path: message".
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}
