package policy_test

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
)

// keyOf returns the composite key of the only match of in, or "-" when no
// rule applies.
func keyOf(t *testing.T, p *policy.Policy, in *policy.Input) string {
	t.Helper()
	ms, err := p.Match(in)
	if err != nil {
		t.Fatal(err)
	}
	switch len(ms) {
	case 0:
		return "-"
	case 1:
		return ms[0].Request.Key
	}
	t.Fatalf("%d matches", len(ms))
	return ""
}

func peer(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestClientIPTrustedProxies(t *testing.T) {
	p := mustParse(t, `trusted_proxies: ["10.0.0.0/8", "fd00::/8", "192.0.2.7"]
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 1}
`)
	cases := []struct {
		name string
		peer string
		h    http.Header
		want string
	}{
		{"no proxy", "203.0.113.5:1234", nil, "203.0.113.5"},
		{"spoofed XFF from an untrusted peer", "203.0.113.5:1234", http.Header{"X-Forwarded-For": {"1.2.3.4"}}, "203.0.113.5"},
		{"spoofed Forwarded from an untrusted peer", "203.0.113.5:1234", http.Header{"Forwarded": {"for=1.2.3.4"}}, "203.0.113.5"},
		{"XFF from a trusted proxy", "10.0.0.1:80", http.Header{"X-Forwarded-For": {"1.2.3.4"}}, "1.2.3.4"},
		{"single trusted address", "192.0.2.7:80", http.Header{"X-Forwarded-For": {"1.2.3.4"}}, "1.2.3.4"},
		{"client-supplied hops before the proxy's", "10.0.0.1:80", http.Header{"X-Forwarded-For": {"6.6.6.6, 1.2.3.4, 10.0.0.2"}}, "1.2.3.4"},
		{"several XFF lines", "10.0.0.1:80", http.Header{"X-Forwarded-For": {"6.6.6.6", "1.2.3.4"}}, "1.2.3.4"},
		{"only trusted hops", "10.0.0.1:80", http.Header{"X-Forwarded-For": {"10.0.0.3, 10.0.0.2"}}, "10.0.0.3"},
		{"garbage hop stops at the last trusted address", "10.0.0.1:80", http.Header{"X-Forwarded-For": {"1.2.3.4, garbage"}}, "10.0.0.1"},
		{"garbage before the client", "10.0.0.1:80", http.Header{"X-Forwarded-For": {"garbage, 1.2.3.4"}}, "1.2.3.4"},
		{"XFF with ports", "10.0.0.1:80", http.Header{"X-Forwarded-For": {"1.2.3.4:5678"}}, "1.2.3.4"},
		{"Forwarded is not read: client_header is X-Forwarded-For", "10.0.0.1:80", http.Header{"Forwarded": {`for="[2001:db8::1]:443";proto=https, for=10.0.0.9`}}, "10.0.0.1"},
		{"empty XFF items are skipped", "10.0.0.1:80", http.Header{"X-Forwarded-For": {"6.6.6.6,, 1.2.3.4 ,"}}, "1.2.3.4"},
		{"XFF wins over a client-supplied Forwarded", "10.0.0.1:80", http.Header{"X-Forwarded-For": {"1.2.3.4"}, "Forwarded": {"for=6.6.6.6"}}, "1.2.3.4"},
		{"IPv6 trusted proxy", "[fd00::1]:80", http.Header{"X-Forwarded-For": {"1.2.3.4"}}, "1.2.3.4"},
		{"IPv4-mapped peer", "[::ffff:203.0.113.5]:80", nil, "203.0.113.5"},
		{"IPv4-mapped trusted peer", "[::ffff:10.0.0.1]:80", http.Header{"X-Forwarded-For": {"1.2.3.4"}}, "1.2.3.4"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := &policy.Input{Peer: peer(tc.peer), Header: tc.h}
			if got := keyOf(t, p, in); got != tc.want {
				t.Errorf("Match: key %q, want %q", got, tc.want)
			}
			p.ResolveClient(in)
			want := tc.want
			if pr, err := netip.ParsePrefix(want); err == nil {
				want = "2001:db8::1" // the address itself; keys group it by /64
				_ = pr
			}
			if got := in.ClientIP.String(); got != want {
				t.Errorf("ResolveClient: %q, want %q", got, tc.want)
			}
		})
	}
	if !p.TrustedProxy(netip.MustParseAddr("10.1.2.3")) || p.TrustedProxy(netip.MustParseAddr("11.0.0.1")) {
		t.Error("TrustedProxy")
	}

	// FromHTTP resolves the client from the socket address.
	r := httptest.NewRequest("GET", "http://Example.COM:8080/a/../b?x=1", nil)
	r.RemoteAddr = "10.0.0.1:5555"
	r.Header.Set("X-Forwarded-For", "198.51.100.7")
	in := p.FromHTTP(r)
	if in.ClientIP.String() != "198.51.100.7" || in.Path != "/b" && in.Path != "/a/../b" || in.Method != "GET" || in.RawQuery != "x=1" {
		t.Fatalf("FromHTTP: %+v", in)
	}
}

// A proxy that writes the client's address in Forwarded passes a
// client's own X-Forwarded-For on untouched. Read beside Forwarded (as
// X-Forwarded-For was, whenever present, before client_header), it let
// every client name its address, a fresh one per request; with
// client_header: Forwarded only the proxy's header is read.
func TestAttackXForwardedForPastForwardedProxy(t *testing.T) {
	p := mustParse(t, `trusted_proxies: ["10.0.0.0/8"]
client_header: forwarded
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 1}
`)
	if got := p.Settings.ClientHeader; got != "Forwarded" {
		t.Fatalf("ClientHeader %q, want the canonical Forwarded", got)
	}
	for i := range 20 {
		in := &policy.Input{Peer: peer("10.0.0.1:80"), Header: http.Header{
			"X-Forwarded-For": {fmt.Sprintf("198.51.100.%d", i)}, // the client's
			"Forwarded":       {`for="[2001:db8::1]:443";proto=https, for=203.0.113.9`},
		}}
		if got := keyOf(t, p, in); got != "203.0.113.9" {
			t.Fatalf("request %d: key %q, want the address the proxy wrote in Forwarded, 203.0.113.9", i, got)
		}
	}
	// The proxy appends to a Forwarded the client sent: the walk from the
	// right stops at the first address outside trusted_proxies.
	in := &policy.Input{Peer: peer("10.0.0.1:80"), Header: http.Header{"Forwarded": {"for=6.6.6.6", "for=203.0.113.9;proto=http"}}}
	if got := keyOf(t, p, in); got != "203.0.113.9" {
		t.Fatalf("key %q, want 203.0.113.9", got)
	}
	// Nothing but the named header: X-Forwarded-For alone is the client's.
	in = &policy.Input{Peer: peer("10.0.0.1:80"), Header: http.Header{"X-Forwarded-For": {"198.51.100.1"}}}
	if got := keyOf(t, p, in); got != "10.0.0.1" {
		t.Fatalf("key %q, want the proxy's own address when its header is missing", got)
	}
}

func TestClientHeaderSetting(t *testing.T) {
	p := mustParse(t, `trusted_proxies: ["10.0.0.0/8"]
client_header: x-real-ip
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 1}
`)
	in := &policy.Input{Peer: peer("10.0.0.1:80"), Header: http.Header{"X-Real-Ip": {"203.0.113.9"}, "X-Forwarded-For": {"198.51.100.1"}}}
	if got := keyOf(t, p, in); got != "203.0.113.9" {
		t.Fatalf("key %q, want X-Real-IP's 203.0.113.9", got)
	}
	for _, bad := range []string{`"X Real IP"`, "Host", "Connection", `""`} {
		_, err := policy.Parse("p.yaml", []byte("client_header: "+bad+"\nrules: [{name: a, algorithm_config: {rps: 1, burst: 1}}]\n"))
		if err == nil || !strings.Contains(err.Error(), "p.yaml:1") || !strings.Contains(err.Error(), "client_header") {
			t.Errorf("client_header: %s: error %v, want one naming p.yaml:1 and client_header", bad, err)
		}
	}
}

func TestIPv6Grouping(t *testing.T) {
	cfg := "rules:\n  - name: per-ip\n    limit_keys: [\"ip:address\"]\n    algorithm_config: {rps: 1, burst: 1}\n"
	p := mustParse(t, cfg)
	a := keyOf(t, p, &policy.Input{Peer: peer("[2001:db8:1:2:aaaa::1]:1")})
	b := keyOf(t, p, &policy.Input{Peer: peer("[2001:db8:1:2:bbbb:cccc:dddd:eeee]:1")})
	c := keyOf(t, p, &policy.Input{Peer: peer("[2001:db8:1:3::1]:1")})
	if a != "2001:db8:1:2::/64" || a != b || a == c {
		t.Fatalf("/64 grouping: %q %q %q", a, b, c)
	}
	if k := keyOf(t, p, &policy.Input{Peer: peer("192.0.2.1:1")}); k != "192.0.2.1" {
		t.Fatalf("IPv4 key %q", k)
	}
	p48 := mustParse(t, "ipv6_prefix: 48\n"+cfg)
	if k := keyOf(t, p48, &policy.Input{Peer: peer("[2001:db8:1:3::1]:1")}); k != "2001:db8:1::/48" {
		t.Fatalf("/48 key %q", k)
	}
	p128 := mustParse(t, "ipv6_prefix: 128\n"+cfg)
	if k := keyOf(t, p128, &policy.Input{Peer: peer("[2001:db8::1]:1")}); k != "2001:db8::1/128" {
		t.Fatalf("/128 key %q", k)
	}
}

func TestAbsentKey(t *testing.T) {
	cfg := `rules:
  - name: per-key
    limit_keys: ["header:x-api-key"]
    algorithm_config: {rps: 1, burst: 1}
`
	p := mustParse(t, cfg)
	none := keyOf(t, p, &policy.Input{})
	none2 := keyOf(t, p, &policy.Input{Header: http.Header{"X-Other": {"x"}}})
	if none != policy.AbsentMarker || none2 != none {
		t.Fatalf("absent keys %q %q, want both %q (one shared bucket)", none, none2, policy.AbsentMarker)
	}
	if k := keyOf(t, p, &policy.Input{Header: http.Header{"X-Api-Key": {"(absent)"}}}); k == none {
		t.Fatalf("a present value forged the absent bucket: %q", k)
	}
	// Present and empty: a bucket of its own, never the empty key that
	// sluice.Limiter refuses, and one no sent value can forge.
	if k := keyOf(t, p, &policy.Input{Header: http.Header{"X-Api-Key": {""}}}); k != policy.EmptyMarker || k == none {
		t.Fatalf("an empty header is present and empty, got %q", k)
	}
	if k := keyOf(t, p, &policy.Input{Header: http.Header{"X-Api-Key": {policy.EmptyMarker}}}); k == policy.EmptyMarker {
		t.Fatalf("a present value forged the empty bucket: %q", k)
	}
	skip := mustParse(t, "missing_key: skip\n"+cfg)
	if k := keyOf(t, skip, &policy.Input{}); k != "-" {
		t.Fatalf("missing_key: skip applied the rule with key %q", k)
	}
	perRule := mustParse(t, strings.Replace(cfg, "    algorithm_config", "    missing_key: skip\n    algorithm_config", 1))
	if k := keyOf(t, perRule, &policy.Input{}); k != "-" {
		t.Fatalf("rule-level missing_key: skip applied the rule with key %q", k)
	}
	global := mustParse(t, "rules:\n  - name: all\n    algorithm_config: {rps: 1, burst: 1}\n")
	if k := keyOf(t, global, &policy.Input{}); k != "*" {
		t.Fatalf("global key %q", k)
	}
}

// TestAttackEnvoyRuleSharedOverHTTP: a rule keyed on an Envoy
// descriptor with no domain to match met every HTTP request (forward
// auth, the proxy) with its key absent, one bucket that one client used
// up for every other. A rule keyed only on what HTTP requests never carry
// does not apply to them; one keyed on both still does.
func TestAttackEnvoyRuleSharedOverHTTP(t *testing.T) {
	p := mustParse(t, `rules:
  - name: per-address
    limit_keys: ["descriptor:remote_address"]
    algorithm_config: {rps: 1, burst: 1}
`)
	if k := keyOf(t, p, &policy.Input{Path: "/", Peer: peer("192.0.2.1:1")}); k != "-" {
		t.Fatalf("an HTTP request was charged under %q", k)
	}
	if k := keyOf(t, p, &policy.Input{Domain: "edge", Descriptor: []policy.DescriptorEntry{{Key: "remote_address", Value: "192.0.2.1"}}}); k != "192.0.2.1" {
		t.Fatalf("an Envoy descriptor was charged under %q", k)
	}
	both := mustParse(t, `rules:
  - name: per-key
    limit_keys: ["descriptor:user", "header:x-user"]
    algorithm_config: {rps: 1, burst: 1}
`)
	if k := keyOf(t, both, &policy.Input{Header: http.Header{"X-User": {"a"}}}); k != policy.AbsentMarker+"|a" {
		t.Fatalf("a rule keyed on both was charged under %q", k)
	}
}

func TestKeyInjection(t *testing.T) {
	p := mustParse(t, `rules:
  - name: per-org-rps
    limit_keys: ["header:x-a", "header:x-b"]
    algorithm_config: {rps: 1, burst: 1}
`)
	key := func(a, b string) string {
		return keyOf(t, p, &policy.Input{Header: http.Header{"X-A": {a}, "X-B": {b}}})
	}
	if k := key("org-abc", "x"); k != "org-abc|x" {
		t.Fatalf("plain key %q", k)
	}
	pairs := [][2][2]string{
		{{"1|2", "3"}, {"1", "2|3"}},
		{{"a:b", "c"}, {"a", "b:c"}},
		{{"a%7Cb", "c"}, {"a|b", "c"}},
		{{"(absent)", "x"}, {"", "x"}},
		{{"x", "y"}, {"x|y", ""}},
	}
	for _, pr := range pairs {
		k1, k2 := key(pr[0][0], pr[0][1]), key(pr[1][0], pr[1][1])
		if k1 == k2 {
			t.Errorf("%q and %q collide as %q", pr[0], pr[1], k1)
		}
	}
	for _, v := range []string{"a|b", "a:b", "{tag}", "a\nb", "a b", "é", "#x", "(x)", "%"} {
		k := key(v, "z")
		if strings.ContainsAny(strings.TrimSuffix(k, "|z"), "|:{}\n ()#") || !strings.HasSuffix(k, "|z") {
			t.Errorf("value %q leaks separators into key %q", v, k)
		}
	}
	long := strings.Repeat("x", 200)
	k := key(long, "z")
	if len(k) != 1+64+2 || k[0] != '#' || key(long, "z") != k || key(long+"y", "z") == k {
		t.Errorf("long value key %q", k)
	}
	lim := p.Rule("per-org-rps").Limit
	if got := lim.StorageKey(key("org-abc", "x")); got != "tb:per-org-rps:org-abc|x" {
		t.Errorf("storage key %q", got)
	}
}

func TestMatchConditions(t *testing.T) {
	p := mustParse(t, `rules:
  - name: api-writes
    limit_keys: ["method", "path", "host"]
    match:
      path_prefix: [/api/, /v2/]
      method: [post, PUT]
      host: API.example.com
    algorithm_config: {rps: 1, burst: 1}
  - name: search
    limit_keys: ["query:q"]
    match: {path: /search/, "query:lang": en}
    algorithm_config: {rps: 1, burst: 1}
  - name: envoy
    limit_keys: ["descriptor:user", "descriptor"]
    match: {domain: edge, "descriptor:route": [a, b]}
    algorithm_config: {rps: 1, burst: 1}
`)
	names := func(in *policy.Input) string {
		ms, _ := p.Match(in)
		var out []string
		for _, m := range ms {
			out = append(out, m.Rule.Name+"="+m.Request.Key)
		}
		return strings.Join(out, ",")
	}
	cases := []struct {
		in   *policy.Input
		want string
	}{
		{&policy.Input{Method: "POST", Path: "/api/x", Host: "api.example.com:8443"}, "api-writes=POST|/api/x|api.example.com"},
		{&policy.Input{Method: "put", Path: "/x/../api/y", Host: "Api.Example.Com"}, "api-writes=PUT|/api/y|api.example.com"},
		{&policy.Input{Method: "GET", Path: "/api/x", Host: "api.example.com"}, ""},
		{&policy.Input{Method: "POST", Path: "/apix", Host: "api.example.com"}, ""},
		{&policy.Input{Method: "POST", Path: "/api/x", Host: "other.example.com"}, ""},
		{&policy.Input{Path: "/search", Query: url.Values{"lang": {"en"}, "q": {"go"}}}, ""},
		{&policy.Input{Path: "/search/", Query: url.Values{"lang": {"en"}, "q": {"go"}}}, "search=go"},
		{&policy.Input{Path: "/search/", Query: url.Values{"lang": {"de"}}}, ""},
		{&policy.Input{Domain: "edge", Descriptor: []policy.DescriptorEntry{{"route", "a"}, {"user", "u=1"}}}, "envoy=u=1|route=a,user=u%3D1"},
		{&policy.Input{Domain: "edge", Descriptor: []policy.DescriptorEntry{{"route", "c"}}}, ""},
		{&policy.Input{Domain: "other", Descriptor: []policy.DescriptorEntry{{"route", "a"}}}, ""},
	}
	for i, tc := range cases {
		if got := names(tc.in); got != tc.want {
			t.Errorf("case %d: %q, want %q", i, got, tc.want)
		}
	}
}

func TestCostSource(t *testing.T) {
	p := mustParse(t, `rules:
  - name: weighted
    algorithm_config:
      rps: 10
      burst: 100
      cost_source: header:x-weight
      default_cost: 2
  - name: by-query
    algorithm_config: {rps: 10, burst: 100, cost_source: "query:cost"}
  - name: fixed
    algorithm_config: {rps: 10, burst: 100, fixed_cost: 3}
`)
	costs := func(weight string, q url.Values) []float64 {
		h := http.Header{}
		if weight != "" {
			h.Set("X-Weight", weight)
		}
		ms, _ := p.Match(&policy.Input{Header: h, Query: q})
		var out []float64
		for _, m := range ms {
			out = append(out, m.Request.Cost)
		}
		return out
	}
	for _, tc := range []struct {
		weight string
		want   float64
	}{
		// Below min_cost (1 by default) a declared cost is charged min_cost.
		{"5", 5}, {" 1.5 ", 1.5}, {" 0.5 ", 1}, {"", 2}, {"abc", 2}, {"-3", 2}, {"0", 2}, {"NaN", 2}, {"1e-9", 1},
		{"1e400", math.Inf(1)}, {"+Inf", math.Inf(1)}, {"1000", 1000},
	} {
		if got := costs(tc.weight, nil); got[0] != tc.want {
			t.Errorf("weight %q: cost %v, want %v", tc.weight, got[0], tc.want)
		}
	}
	if got := costs("", url.Values{"cost": {"7"}}); got[1] != 7 || got[2] != 3 {
		t.Errorf("query and fixed costs: %v", got)
	}
	if got := costs("", nil); got[1] != 1 {
		t.Errorf("default default_cost: %v", got)
	}
}

// Attack: a rule matches host api.example.com. The client sends
// "Host: api.example.com.:443": a fully qualified name with a port, which
// front proxies and virtual hosts (nginx drops the trailing dot) serve as
// api.example.com. hostOnly drops the trailing dot only when there is no
// port, so the rule does not apply and the request goes through unlimited.
func TestAttackHostTrailingDotWithPort(t *testing.T) {
	p := mustParse(t, `rules:
  - name: api
    limit_keys: ["host"]
    match: {host: api.example.com}
    algorithm_config: {rps: 1, burst: 1}
`)
	for _, host := range []string{"api.example.com", "api.example.com.", "api.example.com:443", "api.example.com.:443"} {
		ms, err := p.Match(&policy.Input{Method: "GET", Path: "/", Host: host})
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != 1 || ms[0].Request.Key != "api.example.com" {
			t.Errorf("Host %q: matches %v, want the api rule keyed api.example.com", host, ms)
		}
	}
}

// Attack: the key header sent twice with different values,
// "X-Api-Key: decoy-N" then "X-Api-Key: mine". sluice keys the first;
// servers differ over which one counts (PHP behind nginx's FastCGI takes
// the last, CGI and WSGI servers join them), exactly as they do for a
// repeated query parameter, which sluice reads as (ambiguous). Here the
// client names a fresh bucket per request while such an upstream serves
// its own key; and a cost header sent as 1 then 100 is charged 1.
func TestAttackRepeatedHeaderPicksBucket(t *testing.T) {
	p := mustParse(t, `rules:
  - name: per-key
    limit_keys: ["header:x-api-key"]
    algorithm_config: {rps: 1, burst: 2}
  - name: weighted
    algorithm_config: {rps: 10, burst: 100, cost_source: "header:x-weight"}
`)
	in := fromIP("192.0.2.1")
	in.Header = http.Header{"X-Api-Key": {"decoy-1", "mine"}, "X-Weight": {"1", "100"}}
	ms, err := p.Match(in)
	if err != nil || len(ms) != 2 {
		t.Fatalf("match %v %v", ms, err)
	}
	if got := ms[0].Request.Key; got != policy.AmbiguousMarker {
		t.Errorf("X-Api-Key sent as decoy-1 then mine is keyed %q, want %q", got, policy.AmbiguousMarker)
	}
	if got := ms[1].Request.Cost; got != 100 {
		t.Errorf("X-Weight sent as 1 then 100 costs %v, want 100 (the most a server reads)", got)
	}
}

// Attack: PHP reads a query parameter's name with '.' and ' ' turned into
// '_' (the PHP manual: "a.b becomes $_REQUEST["a_b"]"), and the last of a
// repeated name wins. ?api_key=decoy&api.key=mine is api_key=mine to a
// PHP upstream, while sluice reads api_key=decoy, one value, present: the
// client names a fresh bucket per request (or another client's) while the
// upstream serves its own key. Such a parameter reads differently on
// servers sluice says it reads as (docs/concepts.md, "Query parameters":
// "as browsers, nginx, PHP, Python and Node read them"), so it must be
// (ambiguous), never a bucket of the client's choosing.
func TestAttackQueryPHPMangledName(t *testing.T) {
	p := mustParse(t, `rules:
  - name: per-key
    limit_keys: ["query:api_key"]
    algorithm_config: {rps: 1, burst: 2}
`)
	for _, q := range []string{
		"api_key=decoy1&api.key=mine",
		"api_key=decoy2&api+key=mine",
		"api_key=decoy3&api%20key=mine",
	} {
		in := fromIP("192.0.2.1")
		in.RawQuery = q
		ms, err := p.Match(in)
		if err != nil || len(ms) != 1 {
			t.Fatalf("%s: match %v %v", q, ms, err)
		}
		if got := ms[0].Request.Key; got != policy.AmbiguousMarker {
			t.Errorf("?%s is keyed %q; a PHP upstream reads api_key=mine: want %q", q, got, policy.AmbiguousMarker)
		}
	}
}

// Attack: a per-address rule written as limit_keys: [header:X-Forwarded-For]
// (or X-Real-IP, CF-Connecting-IP and the like). The value is whatever the
// client sent, or begins with it where a proxy appends, so a client that
// sends a new address with each request gets a fresh bucket each time; the
// file loaded without a word. Now the loader warns, pointing at
// ip:address, which reads client_header only from trusted_proxies.
func TestAttackAddressHeaderKeyMintsBuckets(t *testing.T) {
	for _, h := range []string{"X-Forwarded-For", "forwarded", "X-Real-IP", "CF-Connecting-IP", "True-Client-IP"} {
		p := mustParse(t, "rules:\n  - name: per-ip\n    limit_keys: [\"header:"+h+"\"]\n    algorithm_config: {rps: 1, burst: 1}\n")
		a, b := fromIP("10.0.0.1"), fromIP("10.0.0.1")
		a.Header = http.Header{http.CanonicalHeaderKey(h): {"192.0.2.1, 203.0.113.9"}}
		b.Header = http.Header{http.CanonicalHeaderKey(h): {"192.0.2.2, 203.0.113.9"}}
		if keyOf(t, p, a) == keyOf(t, p, b) {
			t.Fatalf("%s: the attack no longer mints buckets; this test needs another", h)
		}
		if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "header:"+h+" is the client's address as the client, or a proxy in front, states it") {
			t.Errorf("%s: warnings %q, want one saying the client picks its address", h, p.Warnings)
		}
	}
}

// Attack: trusted_proxies that trust (nearly) everyone, 0.0.0.0/0 or ::/0
// as "trust the proxy" is often written. Every peer is then a trusted
// proxy, so any client names its own address in X-Forwarded-For, a fresh
// one with each request, or another client's to spend that client's
// bucket. Such a prefix is refused, in a file and in code.
func TestAttackTrustEveryone(t *testing.T) {
	for _, cidr := range []string{"0.0.0.0/0", "::/0", "64.0.0.0/2", "::ffff:0.0.0.0/96", "2000::/3", "::ffff:0.0.0.0/100"} {
		_, err := policy.Parse("c.yaml", []byte("trusted_proxies: [\""+cidr+"\"]\nproxy: {listen: 127.0.0.1:0, upstream: http://127.0.0.1:1}\nrules:\n  - name: per-ip\n    limit_keys: [ip:address]\n    algorithm_config: {rps: 1, burst: 1}\n"))
		if err == nil || !strings.Contains(err.Error(), "trusted_proxies: \""+cidr+"\" trusts") {
			t.Errorf("trusted_proxies: [%s]: %v, want it refused", cidr, err)
		}
		s := policy.DefaultSettings()
		s.TrustedProxies = []netip.Prefix{netip.MustParsePrefix(cidr)}
		if _, err := policy.FromRules(s, policy.CodeRule{Limit: sluice.MustLimit(sluice.Spec{Name: "per-ip", TokensPerSecond: 1, Burst: 1})}); err == nil || !strings.Contains(err.Error(), "trusts") {
			t.Errorf("TrustedProxies %s in code: %v, want it refused", cidr, err)
		}
	}
	for _, cidr := range []string{"10.0.0.0/8", "fc00::/7", "2400:cb00::/32", "::ffff:10.0.0.0/104"} {
		if _, err := policy.Parse("c.yaml", []byte("trusted_proxies: [\""+cidr+"\"]\nproxy: {listen: 127.0.0.1:0, upstream: http://127.0.0.1:1}\nrules:\n  - name: per-ip\n    limit_keys: [ip:address]\n    algorithm_config: {rps: 1, burst: 1}\n")); err != nil {
			t.Errorf("trusted_proxies: [%s]: %v", cidr, err)
		}
	}
}
