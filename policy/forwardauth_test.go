package policy_test

import (
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

const oneRule = `
rules:
  - name: r
    algorithm_config: {rps: 1, burst: 1}
`

func TestForwardAuthConfig(t *testing.T) {
	for _, c := range []struct {
		name, cfg string
		want      []string
	}{
		{"a typo", "trusted_proxies: [127.0.0.1]\nforward_auth: {proxy: ngnix}\n",
			[]string{`c.yaml:2: forward_auth.proxy: unknown proxy "ngnix" (did you mean "nginx"?)`}},
		{"unknown", "trusted_proxies: [127.0.0.1]\nforward_auth: {proxy: haproxy}\n",
			[]string{`c.yaml:2: forward_auth.proxy: unknown proxy "haproxy" (want nginx, traefik, caddy, envoy or custom)`}},
		{"no proxy", "forward_auth: {}\n",
			[]string{`c.yaml:1: forward_auth.proxy: is required: the front proxy that calls /v1/auth (nginx, traefik, caddy, envoy or custom)`}},
		{"a header for a known proxy", "forward_auth: {proxy: nginx, uri_header: X-Uri}\n",
			[]string{`c.yaml:1: forward_auth.uri_header: applies only with proxy: custom (nginx reads X-Original-Method, X-Original-Uri, X-Original-Host and X-Real-Ip)`}},
		{"custom without headers", "forward_auth:\n  proxy: custom\n  method_header: X-M\n",
			[]string{
				`c.yaml:2: forward_auth.uri_header: is required with proxy: custom (the header the proxy sets itself)`,
				`c.yaml:2: forward_auth.host_header: is required with proxy: custom (the header the proxy sets itself)`,
				`c.yaml:2: forward_auth.client_header: is required with proxy: custom (the header the proxy sets itself)`,
			}},
		{"custom with bad headers", "forward_auth:\n  proxy: custom\n  method_header: Connection\n  uri_header: \"X Uri\"\n  host_header: X-H\n  client_header: x-h\n",
			[]string{
				`c.yaml:3: forward_auth.method_header: "Connection" is a hop-by-hop header, which no proxy passes on`,
				`c.yaml:4: forward_auth.uri_header: must be a header name such as "X-Original-URI" (got "X Uri")`,
				`c.yaml:6: forward_auth.client_header: "x-h" is also host_header`,
			}},
		{"Host for the URI", "forward_auth: {proxy: custom, method_header: X-M, uri_header: Host, host_header: X-H, client_header: X-C}\n",
			[]string{`c.yaml:1: forward_auth.uri_header: "Host" holds the host, not the uri`}},
		{"a typo in a field", "trusted_proxies: [127.0.0.1]\nforward_auth: {proxy: nginx, poxy: nginx}\n",
			[]string{`c.yaml:2: forward_auth.poxy: unknown field (did you mean "proxy"?)`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := problems(t, c.cfg+oneRule); !slices.Equal(got, c.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}

	p := mustParse(t, "forward_auth: {proxy: custom, method_header: x-m, uri_header: x-u, host_header: host, client_header: x-c}\n"+oneRule)
	if got, want := p.Settings.ForwardAuth, (policy.ForwardAuth{Proxy: "custom", MethodHeader: "X-M", URIHeader: "X-U", HostHeader: "Host", ClientHeader: "X-C"}); got != want {
		t.Errorf("custom: %+v, want %+v", got, want)
	}
}

func TestForwardAuthWarnings(t *testing.T) {
	for _, c := range []struct {
		name, cfg string
		want      []string
	}{
		{"forward_auth without trusted proxies", "forward_auth: {proxy: caddy}\n",
			[]string{"test.yaml:1: forward_auth: trusted_proxies is empty, so no caller's headers are believed and /v1/auth judges every call as itself; list the front proxy's address in trusted_proxies"}},
		{"trusted proxies without forward_auth", "trusted_proxies: [10.0.0.0/8]\n",
			[]string{"test.yaml:1: trusted_proxies: forward_auth is not set, so /v1/auth believes none of a proxy's headers and counts every call it makes as the proxy's own request; name the front proxy with forward_auth: {proxy: nginx | traefik | caddy | envoy | custom}"}},
		{"for the reverse proxy", "trusted_proxies: [10.0.0.0/8]\nproxy: {listen: \":8000\", upstream: \"http://app\"}\n", nil},
		{"both", "trusted_proxies: [10.0.0.0/8]\nforward_auth: {proxy: envoy}\n", nil},
		{"neither", "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := mustParse(t, c.cfg+oneRule).Warnings; !slices.Equal(got, c.want) {
				t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
}

func TestFromForwardAuth(t *testing.T) {
	const rules = `
rules:
  - name: r
    limit_keys: ["ip:address", "method", "host", "path", "query:q"]
    algorithm_config: {rps: 1, burst: 1}
`
	for _, c := range []struct {
		name, cfg, remote, target string
		hdr                       []string
		want                      string // the key, or "error: ..."
	}{
		{"nginx", "forward_auth: {proxy: nginx}", "10.0.0.1:80", "/v1/auth?deny_status=403",
			[]string{"X-Original-Method", "post", "X-Original-Uri", "/A/../Login?q=1", "X-Original-Host", "App.Example:8443", "X-Real-Ip", "192.0.2.9",
				"X-Forwarded-Uri", "/x", "X-Forwarded-For", "6.6.6.6", "X-Forwarded-Method", "GET"},
			"192.0.2.9|POST|app.example|/login|1"},
		{"traefik: the client's own X-Forwarded-For entries come first", "forward_auth: {proxy: traefik}", "10.0.0.1:80", "/v1/auth",
			[]string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/a", "X-Forwarded-Host", "h", "X-Forwarded-For", "6.6.6.6, 192.0.2.9, 10.0.0.2",
				"X-Real-Ip", "7.7.7.7", "X-Original-Uri", "/b"},
			"192.0.2.9|GET|h|/a|(absent)"},
		{"envoy: the call's own method, path and host", "forward_auth: {proxy: envoy}", "10.0.0.1:80", "/v1/auth//x/../Orders;v=1?q=a;b",
			[]string{"X-Forwarded-For", "192.0.2.9", "X-Forwarded-Uri", "/x", "X-Original-Uri", "/y"},
			"192.0.2.9|GET|example.com|/orders|(ambiguous)"},
		{"custom, host from Host", "forward_auth: {proxy: custom, method_header: X-M, uri_header: X-U, host_header: Host, client_header: X-C}", "10.0.0.1:80", "/v1/auth",
			[]string{"X-M", "PUT", "X-U", "/u", "X-C", "192.0.2.9"},
			"192.0.2.9|PUT|example.com|/u|(absent)"},
		{"untrusted caller", "forward_auth: {proxy: nginx}", "192.0.2.1:80", "/v1/auth?q=2",
			[]string{"X-Original-Method", "POST", "X-Original-Uri", "/login", "X-Original-Host", "h", "X-Real-Ip", "192.0.2.9", "X-Forwarded-For", "6.6.6.6"},
			"192.0.2.1|GET|example.com|/v1/auth|2"},
		{"no forward_auth", "", "10.0.0.1:80", "/v1/auth",
			[]string{"X-Original-Method", "POST", "X-Original-Uri", "/login", "X-Forwarded-For", "6.6.6.6", "Forwarded", "for=6.6.6.7"},
			"10.0.0.1|GET|example.com|/v1/auth|(absent)"},
		{"an unparsable client hop", "forward_auth: {proxy: nginx}", "10.0.0.1:80", "/v1/auth",
			[]string{"X-Original-Method", "GET", "X-Original-Uri", "/", "X-Original-Host", "h", "X-Real-Ip", "unix:"},
			"10.0.0.1|GET|h|/|(absent)"},
		{"envoy without the original path", "forward_auth: {proxy: envoy}", "10.0.0.1:80", "/v1/authx",
			[]string{"X-Forwarded-For", "192.0.2.9"},
			"error: forward auth (envoy): the original path must follow /v1/auth"},
		{"envoy without X-Forwarded-For", "forward_auth: {proxy: envoy}", "10.0.0.1:80", "/v1/auth/x",
			nil, "error: forward auth (envoy): the front proxy sent no X-Forwarded-For header"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := mustParse(t, "trusted_proxies: [10.0.0.0/8]\n"+c.cfg+"\n"+rules)
			r := httptest.NewRequest("GET", c.target, nil)
			r.RemoteAddr = c.remote
			for i := 0; i+1 < len(c.hdr); i += 2 {
				r.Header.Add(c.hdr[i], c.hdr[i+1])
			}
			in, err := p.FromForwardAuth(r, "/v1/auth")
			if err != nil {
				if !strings.HasPrefix("error: "+err.Error(), c.want) {
					t.Fatalf("error %q, want %q", err, c.want)
				}
				return
			}
			if got := keyOf(t, p, in); got != c.want {
				t.Errorf("key %q, want %q", got, c.want)
			}
		})
	}
}

// TestPathReading shows how rules read paths: cleaned and case-folded,
// and matched in the most lenient reading too.
func TestPathReading(t *testing.T) {
	p := mustParse(t, `
rules:
  - name: r
    limit_keys: ["path"]
    algorithm_config: {rps: 1, burst: 1}
`)
	for path, want := range map[string]string{
		"":                 "/",
		"/":                "/",
		"/Login":           "/login",
		"//login":          "/login",
		"/a/b/../../login": "/login",
		"/../login":        "/login",
		"/login/":          "/login",
		"/login;x=1":       "/login",
		"/a;b/c;d/":        "/a/c",
		`\login`:           "/login",
		`/a\..\login`:      "/login",
		"/%6Cogin":         "/login", // a path decoded once already: "%6C" came from "%256C"
		"/100%":            "/100%25",
		"/x/..;/admin":     "/admin",
	} {
		if got := keyOf(t, p, &policy.Input{Path: path}); got != want {
			t.Errorf("%q: key %q, want %q", path, got, want)
		}
	}
	m := mustParse(t, `
rules:
  - name: exact
    match: {path: /Login/}
    algorithm_config: {rps: 1, burst: 1}
  - name: prefix
    match: {path_prefix: /Admin/../API/}
    algorithm_config: {rps: 1, burst: 1}
`)
	for path, want := range map[string][]string{
		"/login/":      {"exact"},
		"/LOGIN/":      {"exact"},
		"/login":       nil, // /Login/ is written with its slash; /login is another path
		"/api/v1":      {"prefix"},
		"/API;x/v1":    {"prefix"},
		"/apiary":      nil,
		"/api":         nil,
		"/x/../Api/v1": {"prefix"},
	} {
		ms, err := m.Match(&policy.Input{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, x := range ms {
			got = append(got, x.Rule.Name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%q matched %v, want %v", path, got, want)
		}
	}
}

// TestQueryReading shows how rules read query parameters that servers
// read alike and differently.
func TestQueryReading(t *testing.T) {
	p := mustParse(t, `
rules:
  - name: r
    limit_keys: ["query:k"]
    algorithm_config: {rps: 1, burst: 1}
`)
	for q, want := range map[string]string{
		"k=a":              "a",
		"k=a+b":            "a%20b",
		"k=%41":            "A",
		"k=a&k=a":          "a",
		"x=1&k=a":          "a",
		"k=a%3Bb":          "a;b",
		"k":                "(empty)",
		"K=a":              "(absent)",
		"":                 "(absent)",
		"x=1;y=2":          "(absent)",
		"k=a;b":            "(ambiguous)",
		"x=1;k=a":          "(ambiguous)",
		"k=a&k=b":          "(ambiguous)",
		"k=%zz":            "(ambiguous)",
		"%zz=1&k=a":        "a",
		"k=a&" + many(1e4): "(ambiguous)",
		"k=a&" + many(9e3): "a",
	} {
		if got := keyOf(t, p, &policy.Input{RawQuery: q}); got != want {
			t.Errorf("%.40q: key %q, want %q", q, got, want)
		}
	}
	// An Input built with parsed parameters keeps its first value.
	if got := keyOf(t, p, &policy.Input{Query: map[string][]string{"k": {"a", "b"}}}); got != "a" {
		t.Errorf("Query: key %q", got)
	}
}

func many(n float64) string { return strings.Repeat("x=1&", int(n)) }
