package httpgate_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/policy"
)

const adminToken = "admin-token-0123456789abcdef"

const uiPolicy = `
admin_token_env: ADMIN
rules:
  - name: per-user
    limit_keys: ["header:X-User"]
    algorithm_config: {rps: 1, burst: 5}
  - name: api
    limit_keys: ["header:X-Key"]
    tiers:
      - name: free
        match: {"header:X-Plan": free}
        algorithm_config: {rps: 2, burst: 4}
    algorithm_config: {rps: 10, burst: 20}
  - name: hourly
    mode: shadow
    algorithm: fixed_window
    algorithm_config: {rate: 100, period: 1h}
`

// newUIEnv serves yaml with the live page on, the statistics on the
// env's manual clock, and the admin token set (unless token is "").
func newUIEnv(t *testing.T, yaml, token string) (*env, *insight.Collector) {
	t.Helper()
	var stats *insight.Collector
	e := newEnvOpts(t, mustPolicy(t, yaml), nil, func(e *env, o *httpgate.Options) {
		stats = insight.New(insight.Options{Clock: e.clk, Store: "memory://", Readings: e.prom.Values})
		e.prom.OnStoreCall(stats.StoreCall)
		o.Insight = stats
	})
	if token != "" {
		e.env["ADMIN"] = token
	}
	return e, stats
}

// noRedirect is a client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// getStats reads /v1/stats with hdr.
func getStats(t *testing.T, e *env, hdr ...string) httpgate.Stats {
	t.Helper()
	req, _ := http.NewRequest("GET", e.srv.URL+"/v1/stats", nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/v1/stats: %d %s", resp.StatusCode, body)
	}
	var s httpgate.Stats
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("/v1/stats: %v\n%s", err, body)
	}
	return s
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func sum(xs []uint64) (n uint64) {
	for _, x := range xs {
		n += x
	}
	return n
}

// TestStatsShowsRulesDecisionsAndHotKeys drives decisions through the
// decision API and forward auth and reads them back from /v1/stats: the
// rules as configured, the decisions of each second, the hottest keys
// with their buckets as a peek finds them, the store's calls.
func TestStatsShowsRulesDecisionsAndHotKeys(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	for range 7 { // burst 5: 5 admitted, 2 rejected
		e.post("/v1/take", `{"rule":"per-user","key":"alice"}`)
	}
	e.post("/v1/peek", `{"rule":"per-user","key":"bob"}`) // a peek is no decision
	e.clk.Advance(time.Second)                            // alice gets 1 token back
	e.get("/v1/auth", "X-User", "carol", "X-Key", "k1", "X-Plan", "free")
	e.clk.Advance(time.Second)

	s := getStats(t, e, "Authorization", "Bearer "+adminToken)
	if s.WindowS != insight.Window || s.KeysHashed || s.Store.URL != "memory://" || s.Policy.Changes != 1 {
		t.Errorf("stats: window %d hashed %v store %q changes %d", s.WindowS, s.KeysHashed, s.Store.URL, s.Policy.Changes)
	}
	if len(s.Rules) != 3 {
		t.Fatalf("rules: %+v", s.Rules)
	}
	pu, api, hourly := s.Rules[0], s.Rules[1], s.Rules[2]
	if pu.Name != "per-user" || !pu.InPolicy || pu.Algorithm != "token_bucket" || pu.Mode != "enforce" || pu.OnStoreError != "allow" ||
		!reflect.DeepEqual(pu.Keys, []string{"header:X-User"}) || pu.Source != "test.yaml:4" ||
		!reflect.DeepEqual(pu.Limits, []httpgate.StatsLimit{{Name: "per-user", RatePerSecond: 1, Capacity: 5}}) {
		t.Errorf("per-user: %+v", pu)
	}
	if len(pu.Allowed) != insight.Window || pu.Allowed[insight.Window-2] != 5 || pu.Rejected[insight.Window-2] != 2 || pu.Allowed[insight.Window-1] != 1 || sum(pu.Allowed) != 6 {
		t.Errorf("per-user decisions, last 2 s: allowed %v rejected %v", pu.Allowed[insight.Window-2:], pu.Rejected[insight.Window-2:])
	}
	if api.Name != "api" || !reflect.DeepEqual(api.Limits, []httpgate.StatsLimit{{Name: "api", RatePerSecond: 10, Capacity: 20}, {Name: "api.free", Tier: "free", RatePerSecond: 2, Capacity: 4}}) || sum(api.Allowed) != 1 || api.Rejected != nil {
		t.Errorf("api: %+v", api)
	}
	if hourly.Mode != "shadow" || hourly.Algorithm != "fixed_window" || hourly.Limits[0].WindowS != 3600 || hourly.Limits[0].Capacity != 100 || sum(hourly.Allowed) != 1 || hourly.Keys == nil || len(hourly.Keys) != 0 {
		t.Errorf("hourly: %+v", hourly)
	}

	rej := s.HotKeys.ByRejections
	if rej.Total != 2 || rej.Counters != 256 || rej.ErrorBound != 0 || len(rej.Keys) != 1 {
		t.Fatalf("by rejections: %+v", rej)
	}
	k := rej.Keys[0]
	if k.Rule != "per-user" || k.Limit != "per-user" || k.Key != "alice" || k.Count != 2 || k.Error != 0 || k.Capacity != 5 {
		t.Errorf("hot key: %+v", k)
	}
	// Two seconds at 1/s after the bucket emptied: 2 tokens, no wait.
	if k.Tokens == nil || *k.Tokens != 2 || k.RetryAfterMs == nil || *k.RetryAfterMs != 0 {
		t.Errorf("alice's bucket: tokens %v retry %v", deref(k.Tokens), deref(k.RetryAfterMs))
	}
	traffic := s.HotKeys.ByTraffic
	if traffic.Total != 10 || traffic.Keys[0].Key != "alice" || traffic.Keys[0].Count != 7 {
		t.Errorf("by traffic: %+v", traffic)
	}
	var carol bool
	for _, k := range traffic.Keys {
		if k.Limit == "api.free" && k.Rule == "api" && k.Key == "k1" && k.Capacity == 4 && k.Tokens != nil && *k.Tokens == 4 {
			carol = true
		}
	}
	if !carol {
		t.Errorf("by traffic: no api.free k1, refilled to 4 tokens: %+v", traffic.Keys)
	}
	if s.HotKeys.PeekError != "" {
		t.Errorf("peek error: %s", s.HotKeys.PeekError)
	}
	// 7 takes, 1 peek, and forward auth's take_all of its enforce-mode
	// rules and take of its shadow rule, in the seconds they were in (the
	// page's own peek is in the second in progress).
	if got := sum(s.Store.Calls); got != 10 || len(s.Store.LatencyMs) != insight.Window {
		t.Errorf("store calls %d", got)
	}
	if s.Store.Metrics["sluice_live_keys"] < 1 || s.Store.Breaker != "" {
		t.Errorf("store metrics %v breaker %q", s.Store.Metrics, s.Store.Breaker)
	}
}

// TestUILoginFlow: the page asks for the token, takes it once (as
// ?token= or from the form) for a session cookie, and then serves the
// page and its data to the cookie.
func TestUILoginFlow(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	resp, err := noRedirect.Get(e.srv.URL + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.Contains(string(body), `<form method="post" action="ui/login">`) || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("/ui without a token: %d %v\n%s", resp.StatusCode, resp.Header, body)
	}

	for _, how := range []string{"query", "form"} {
		var resp *http.Response
		var err error
		want := "ui"
		if how == "query" {
			resp, err = noRedirect.Get(e.srv.URL + "/ui?token=" + url.QueryEscape(adminToken))
		} else {
			req, _ := http.NewRequest("POST", e.srv.URL+"/ui/login", strings.NewReader("token="+url.QueryEscape(adminToken)))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", e.srv.URL)
			resp, err = noRedirect.Do(req)
			want = "../ui"
		}
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc, _ := resp.Location()
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want || loc.Path != "/ui" || loc.RawQuery != "" {
			t.Fatalf("%s: %d to %q", how, resp.StatusCode, resp.Header.Get("Location"))
		}
		cookies := resp.Cookies()
		if len(cookies) != 1 || cookies[0].Name != "sluice_ui" || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode || cookies[0].Path != "/" || cookies[0].MaxAge != 12*3600 {
			t.Fatalf("%s: cookies %+v", how, cookies)
		}
		c := cookies[0]
		req, _ := http.NewRequest("GET", e.srv.URL+"/ui", nil)
		req.AddCookie(c)
		page, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		html, _ := io.ReadAll(page.Body)
		page.Body.Close()
		if page.StatusCode != 200 || !strings.Contains(string(html), `<script src="ui/app.js" defer></script>`) || page.Header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s: /ui with the cookie: %d\n%s", how, page.StatusCode, html)
		}
		s := getStats(t, e, "Cookie", c.Name+"="+c.Value)
		if len(s.Rules) != 3 {
			t.Errorf("%s: stats with the cookie: %+v", how, s)
		}
	}

	// The page's own files are there, typed, whoever asks.
	for path, ctype := range map[string]string{"/ui/app.js": "text/javascript; charset=utf-8", "/ui/app.css": "text/css; charset=utf-8"} {
		resp, _ := e.get(path)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != ctype {
			t.Errorf("%s: %d %q", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	// The index lists the page and its data.
	_, idx := e.get("/")
	var paths []string
	for _, ep := range idx["endpoints"].([]any) {
		paths = append(paths, ep.(map[string]any)["path"].(string))
	}
	for _, want := range []string{"/ui", "/v1/stats", "/ui/login"} {
		if !strings.Contains(strings.Join(paths, " "), want) {
			t.Errorf("index lacks %s: %v", want, paths)
		}
	}
}

// TestStatsReloads: a new policy is counted and listed; a rule gone from
// it stays listed while its decisions are in the window.
func TestStatsReloads(t *testing.T) {
	e, stats := newUIEnv(t, uiPolicy, adminToken)
	e.post("/v1/take", `{"rule":"per-user","key":"alice"}`)
	e.gate.SetPolicy(mustPolicy(t, "admin_token_env: ADMIN\nrules:\n  - name: other\n    algorithm_config: {rps: 1, burst: 1}\n"))
	stats.Loaded("test.yaml", []byte("new"), true, nil)
	stats.Loaded("test.yaml", []byte("bad"), true, &policy.Errors{List: []error{&policy.Error{File: "test.yaml", Line: 3, Path: "rules", Msg: "broken"}}})
	e.clk.Advance(time.Second)
	s := getStats(t, e, "Authorization", "Bearer "+adminToken)
	if s.Policy.Changes != 2 || s.Policy.LastReload == nil || s.Policy.LastReload.OK || !strings.Contains(s.Policy.LastReload.Error, "test.yaml:3: rules: broken") || s.Policy.Source != "test.yaml" {
		t.Errorf("policy: %+v %+v", s.Policy, s.Policy.LastReload)
	}
	if len(s.Rules) != 2 || s.Rules[0].Name != "other" || s.Rules[1].Name != "per-user" || s.Rules[1].InPolicy || sum(s.Rules[1].Allowed) != 1 {
		t.Errorf("rules: %+v", s.Rules)
	}
	// The hot key of a rule gone has no bucket to read.
	if k := s.HotKeys.ByTraffic.Keys; len(k) != 1 || k[0].Tokens != nil {
		t.Errorf("hot keys: %+v", k)
	}
}

// TestOpenAPIDescribesStats keeps api/openapi.yaml's /v1/stats and its
// schemas in step with the JSON the handler writes, nested types too.
func TestOpenAPIDescribesStats(t *testing.T) {
	data, err := os.ReadFile("../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths      map[string]map[string]any `yaml:"paths"`
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for path, method := range map[string]string{"/v1/stats": "get", "/v1/stats/key": "get", "/ui": "get", "/ui/login": "post", "/ui/reset": "post"} {
		if _, ok := doc.Paths[path][method]; !ok {
			t.Errorf("openapi lacks %s %s", method, path)
		}
	}
	for schema, v := range map[string]any{
		"Stats": httpgate.Stats{}, "StatsPolicy": httpgate.StatsPolicy{}, "StatsReload": httpgate.StatsReload{},
		"StatsStore": httpgate.StatsStore{}, "StatsRule": httpgate.StatsRule{}, "StatsLimit": httpgate.StatsLimit{},
		"StatsHot": httpgate.StatsHot{}, "StatsRanking": httpgate.StatsRanking{}, "StatsHotKey": httpgate.StatsHotKey{},
		"StatsRequests": httpgate.StatsRequests{}, "StatsFleet": httpgate.StatsFleet{}, "StatsProcess": httpgate.StatsProcess{},
		"StatsKey": httpgate.StatsKey{}, "StatsBucket": httpgate.StatsBucket{}, "StatsLease": httpgate.StatsLease{},
	} {
		rt := reflect.TypeOf(v)
		props := doc.Components.Schemas[schema].Properties
		if len(props) != rt.NumField() {
			t.Errorf("schema %s has %d properties, %s %d fields", schema, len(props), rt.Name(), rt.NumField())
		}
		for i := range rt.NumField() {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			if _, ok := props[name]; !ok {
				t.Errorf("schema %s lacks %s", schema, name)
			}
		}
	}
}

// TestUISessionCookieSecureOverTLS: served over TLS, the session cookie
// is Secure, so the browser never sends it over plain HTTP.
func TestUISessionCookieSecureOverTLS(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	srv := httptest.NewTLSServer(e.gate.Handler())
	defer srv.Close()
	c := srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Get(srv.URL + "/ui?token=" + url.QueryEscape(adminToken))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if cs := resp.Cookies(); resp.StatusCode != 303 || len(cs) != 1 || !cs[0].Secure {
		t.Errorf("over TLS: %d %+v", resp.StatusCode, cs)
	}
}

// Attack: reading the page where nobody configured a token. A page of
// whose traffic is limited must not be open by default, nor open to a
// guessed empty token.
func TestAttackUIOpenWithoutAdminToken(t *testing.T) {
	for name, token := range map[string]string{"no admin_token_env": "", "admin_token_env unset in the environment": ""} {
		yaml := uiPolicy
		if name == "no admin_token_env" {
			yaml = strings.Replace(uiPolicy, "admin_token_env: ADMIN\n", "", 1)
		}
		e, _ := newUIEnv(t, yaml, token)
		e.post("/v1/take", `{"rule":"per-user","key":"victim-user"}`)
		for _, c := range []struct{ method, path, body string }{
			{"GET", "/ui", ""}, {"GET", "/ui?token=", ""}, {"GET", "/v1/stats", ""},
			{"POST", "/ui/login", "token="}, {"GET", "/ui/app.js", ""},
		} {
			resp, body := do(t, e, c.method, c.path, c.body, "Authorization", "Bearer ", "Content-Type", "application/x-www-form-urlencoded", "Cookie", "sluice_ui=x")
			if resp.StatusCode != 403 || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, "admin_token_env") || strings.Contains(body, "victim-user") {
				t.Errorf("%s: %s %s: %d %s", name, c.method, c.path, resp.StatusCode, body)
			}
		}
	}
}

// Attack: reading /v1/stats (or the page) without the admin token: none,
// a wrong one, the API token's header, the token in the query of the
// data endpoint. Nothing of the keys may come back.
func TestAttackStatsWithoutToken(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	e.post("/v1/take", `{"rule":"per-user","key":"victim-user"}`)
	for _, hdr := range [][]string{
		nil,
		{"Authorization", "Bearer wrong-token-0123456789"},
		{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+adminToken))},
		{"X-Sluice-Token", adminToken},
		{"Cookie", "sluice_ui=" + adminToken},
	} {
		for _, path := range []string{"/v1/stats", "/v1/stats?token=" + adminToken, "/ui"} {
			resp, body := do(t, e, "GET", path, "", hdr...)
			if resp.StatusCode != 401 || strings.Contains(body, "victim-user") || len(resp.Cookies()) != 0 {
				t.Errorf("GET %s %v: %d %s", path, hdr, resp.StatusCode, body)
			}
		}
	}
}

// Attack: stealing the session cookie to learn the token, or forging
// one. The cookie is not the token nor its digest; a cookie whose expiry
// was pushed out, whose MAC was changed, issued by another process, or
// issued before the token changed, opens nothing.
func TestAttackForgedSessionCookie(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	c := login(t, e, adminToken)
	digest := sha256.Sum256([]byte(adminToken))
	for _, leak := range []string{adminToken, hex.EncodeToString(digest[:]), base64.RawURLEncoding.EncodeToString(digest[:]), base64.StdEncoding.EncodeToString(digest[:])} {
		if strings.Contains(c.Value, leak) {
			t.Fatalf("the session cookie %q holds the token or its digest", c.Value)
		}
	}
	ok := func(value string) int {
		resp, _ := do(t, e, "GET", "/v1/stats", "", "Cookie", "sluice_ui="+value)
		return resp.StatusCode
	}
	if got := ok(c.Value); got != 200 {
		t.Fatalf("the real cookie: %d", got)
	}
	exp, mac, _ := strings.Cut(c.Value, ".")
	flip := []byte(mac)
	flip[3] ^= 1
	other, _ := newUIEnv(t, uiPolicy, adminToken)
	for name, forged := range map[string]string{
		"the token":         adminToken,
		"expiry pushed out": "9" + exp + "." + mac,
		"expiry moved":      moved(t, exp, -100) + "." + mac,
		"MAC changed":       exp + "." + string(flip),
		"no MAC":            exp + ".",
		"another process's": login(t, other, adminToken).Value,
		"long":              strings.Repeat("9", 5000) + "." + mac,
	} {
		if got := ok(forged); got != 401 {
			t.Errorf("%s (%q): %d", name, forged, got)
		}
	}
	// A new token ends the sessions of the old one.
	e.env["ADMIN"] = adminToken + "-rotated"
	if got := ok(c.Value); got != 401 {
		t.Errorf("after the token changed: %d", got)
	}
}

// moved is the Unix time exp moved by d seconds.
func moved(t *testing.T, exp string, d int64) string {
	t.Helper()
	n, err := strconv.ParseInt(exp, 10, 64)
	if err != nil {
		t.Fatalf("expiry %q: %v", exp, err)
	}
	return strconv.FormatInt(n+d, 10)
}

// Attack: cross-site request forgery with the session. A page elsewhere
// makes the operator's browser post to sluice; the cookie (were it sent)
// must not refill buckets: /v1/reset reads the bearer token alone. And a
// login form posted from another origin (login CSRF) is refused.
func TestAttackSessionCookieCSRF(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	c := login(t, e, adminToken)
	resp, body := do(t, e, "POST", "/v1/reset", `{"rule":"per-user","key":"alice"}`, "Cookie", "sluice_ui="+c.Value, "Content-Type", "application/json")
	if resp.StatusCode != 401 {
		t.Errorf("reset with the session cookie: %d %s", resp.StatusCode, body)
	}
	if c.SameSite != http.SameSiteStrictMode || !c.HttpOnly {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict", c)
	}
	resp, body = do(t, e, "POST", "/ui/login", "token="+url.QueryEscape(adminToken), "Origin", "https://evil.example", "Content-Type", "application/x-www-form-urlencoded")
	if resp.StatusCode != 403 || len(resp.Cookies()) != 0 {
		t.Errorf("login from another origin: %d %v %s", resp.StatusCode, resp.Cookies(), body)
	}
}

// Attack: the token left in the address bar, history and Referer. Given
// as ?token=, it is traded for the cookie and the browser sent on to a
// clean address at once, with no Referer; a wrong one gets no session.
func TestAttackTokenInAddress(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	resp, body := do(t, e, "GET", "/ui?token="+url.QueryEscape(adminToken)+"&x=1", "")
	if resp.StatusCode != 303 || strings.Contains(resp.Header.Get("Location"), "token") || strings.Contains(body, adminToken) || resp.Header.Get("Referrer-Policy") != "no-referrer" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("?token=: %d Location %q %v", resp.StatusCode, resp.Header.Get("Location"), resp.Header)
	}
	resp, body = do(t, e, "GET", "/ui?token=nope", "")
	if resp.StatusCode != 401 || len(resp.Cookies()) != 0 || !strings.Contains(body, "not the admin token") {
		t.Errorf("?token=wrong: %d %v", resp.StatusCode, resp.Cookies())
	}
}

// Attack: a key that is markup. Keys are whatever clients send; the data
// is JSON with markup escaped, never sniffed as HTML, and the page runs
// no script but its own (the browser test shows it drawn as text).
func TestAttackMarkupInKeys(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	const evil = `<img src=x onerror="document.title='pwned'">`
	e.post("/v1/take", `{"rule":"per-user","key":"`+strings.ReplaceAll(evil, `"`, `\"`)+`"}`)
	resp, body := do(t, e, "GET", "/v1/stats", "", "Authorization", "Bearer "+adminToken)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("X-Content-Type-Options") != "nosniff" ||
		strings.Contains(body, "<img") || !strings.Contains(body, `\u003cimg src=x onerror=\"document.title='pwned'\"\u003e`) {
		t.Errorf("stats: %d %v\n%s", resp.StatusCode, resp.Header, body)
	}
	resp, body = do(t, e, "GET", "/ui", "", "Authorization", "Bearer "+adminToken)
	csp := resp.Header.Get("Content-Security-Policy")
	if resp.StatusCode != 200 || strings.Contains(body, "pwned") || !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("page: %d CSP %q", resp.StatusCode, csp)
	}
	js, _ := do(t, e, "GET", "/ui/app.js", "")
	if js.StatusCode != 200 {
		t.Fatalf("app.js: %d", js.StatusCode)
	}
	_, src := do(t, e, "GET", "/ui/app.js", "")
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		if strings.Contains(src, sink) {
			t.Errorf("app.js uses %s, which parses markup", sink)
		}
	}
}

// Attack: learning whose keys they are under ui.show_keys: false. The
// hash is keyed by a secret of the process: a dictionary of addresses or
// user ids hashed with plain SHA-256 finds nothing.
func TestAttackHashedKeysReversed(t *testing.T) {
	yaml := strings.Replace(uiPolicy, "admin_token_env: ADMIN\n", "admin_token_env: ADMIN\nui: {show_keys: false}\n", 1)
	e, _ := newUIEnv(t, yaml, adminToken)
	e.post("/v1/take", `{"rule":"per-user","key":"203.0.113.7"}`)
	_, body := do(t, e, "GET", "/v1/stats", "", "Authorization", "Bearer "+adminToken)
	s := getStats(t, e, "Authorization", "Bearer "+adminToken)
	if strings.Contains(body, "203.0.113.7") || !s.KeysHashed || len(s.HotKeys.ByTraffic.Keys) != 1 {
		t.Fatalf("stats: %s", body)
	}
	h := s.HotKeys.ByTraffic.Keys[0].Key
	plain := sha256.Sum256([]byte("203.0.113.7"))
	if len(h) != 17 || h[0] != '#' || strings.Contains(hex.EncodeToString(plain[:]), h[1:]) {
		t.Errorf("hash %q of the key (plain SHA-256 %x)", h, plain)
	}
	if again := getStats(t, e, "Authorization", "Bearer "+adminToken).HotKeys.ByTraffic.Keys[0].Key; again != h {
		t.Errorf("the hash changes between reads: %q, %q", h, again)
	}
}

// Attack: flooding keys to make the page (or each refresh) expensive: the
// page shows at most ten keys per ranking and reads at most twenty
// buckets per refresh, in one store call, whatever the number of keys.
func TestAttackStatsPeeksBounded(t *testing.T) {
	var mu sync.Mutex
	var peeks []int
	e := newEnvOpts(t, mustPolicy(t, uiPolicy), func(s sluice.Store) sluice.Store {
		return &peekCounter{Store: s, record: func(n int) { mu.Lock(); peeks = append(peeks, n); mu.Unlock() }}
	}, func(e *env, o *httpgate.Options) {
		o.Insight = insight.New(insight.Options{Clock: e.clk, Counters: 64})
	})
	e.env["ADMIN"] = adminToken
	for i := range 500 {
		key := "flood-" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
		e.post("/v1/take", `{"takes":[{"rule":"per-user","key":"`+key+`"},{"rule":"api","key":"`+key+`"}]}`)
	}
	mu.Lock()
	peeks = nil
	mu.Unlock()
	s := getStats(t, e, "Authorization", "Bearer "+adminToken)
	if len(s.HotKeys.ByTraffic.Keys) != 10 || s.HotKeys.ByTraffic.Counters != 64 {
		t.Errorf("by traffic: %d keys, %d counters", len(s.HotKeys.ByTraffic.Keys), s.HotKeys.ByTraffic.Counters)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(peeks) != 1 || peeks[0] > 20 {
		t.Errorf("peeks of one refresh: %v", peeks)
	}
}

// peekCounter records the size of every multi-key peek.
type peekCounter struct {
	sluice.Store
	record func(n int)
}

func (p *peekCounter) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	if op == engine.OpPeek {
		p.record(len(rs))
	}
	return p.Store.TakeAll(ctx, op, rs, dst)
}

// Attack: a rule counted as letting traffic through when another rule of
// the same request rejected it and nothing was charged. Of five requests
// that a global rule of burst 1 lets one through, the per-user rule
// admitted one: /metrics and the live page must say so, and count the
// four others apart, as not charged.
func TestAttackNotChargedIsNotAllowed(t *testing.T) {
	e, _ := newUIEnv(t, `
admin_token_env: ADMIN
rules:
  - name: per-user
    limit_keys: ["header:X-User"]
    algorithm_config: {rps: 100, burst: 100}
  - name: global
    algorithm_config: {rps: 0.001, burst: 1}
`, adminToken)
	codes := map[int]int{}
	for range 5 {
		resp, _ := e.get("/v1/auth", "X-User", "u")
		codes[resp.StatusCode]++
	}
	if codes[200] != 1 || codes[429] != 4 {
		t.Fatalf("answers %v, want one 200 and four 429", codes)
	}
	m := e.metrics()
	for line, want := range map[string]string{
		`sluice_decisions_total{result="allowed",rule="per-user"}`:     "1",
		`sluice_decisions_total{result="not_charged",rule="per-user"}`: "4",
		`sluice_decisions_total{result="rejected",rule="global"}`:      "4",
		`sluice_decisions_total{result="allowed",rule="global"}`:       "1",
	} {
		if !strings.Contains(m, line+" "+want+"\n") {
			t.Errorf("/metrics: want %s %s", line, want)
		}
	}
	if strings.Contains(m, `sluice_decisions_total{result="rejected",rule="per-user"}`) {
		t.Errorf("/metrics counts a rejection of per-user, which had room")
	}
	// The live page's series end at the last completed second.
	e.clk.Advance(time.Second)
	_, st := e.get("/v1/stats", "Authorization", "Bearer "+adminToken)
	rules, _ := st["rules"].([]any)
	sums := map[string]float64{}
	for _, r := range rules {
		r := r.(map[string]any)
		if r["name"] != "per-user" {
			continue
		}
		for _, o := range []string{"allowed", "rejected", "not_charged"} {
			xs, _ := r[o].([]any)
			for _, x := range xs {
				sums[o] += x.(float64)
			}
		}
	}
	if sums["allowed"] != 1 || sums["not_charged"] != 4 || sums["rejected"] != 0 {
		t.Errorf("live page, per-user over the window: %v, want 1 allowed, 4 not charged, 0 rejected", sums)
	}
}

// uiCSRF reads the session's CSRF token from /v1/stats.
func uiCSRF(t *testing.T, e *env, c *http.Cookie) string {
	t.Helper()
	_, body := do(t, e, "GET", "/v1/stats", "", "Cookie", "sluice_ui="+c.Value)
	var s struct{ CSRF string }
	if json.Unmarshal([]byte(body), &s); s.CSRF == "" {
		t.Fatalf("/v1/stats gave the session no CSRF token: %.200s", body)
	}
	return s.CSRF
}

// Attack: the reset button forged. The page's reset button posts with
// the session cookie; a POST that carries the cookie (a browser sends it
// with a same-site request, a subdomain's page included) but not the
// session's CSRF token, or with a wrong one, or from another origin, is
// refused and refills nothing; with the token, as the page sends it, the
// bucket is refilled.
func TestAttackUIResetWithoutCSRF(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	for range 5 {
		e.post("/v1/take", `{"rule":"per-user","key":"alice"}`)
	}
	c := login(t, e, adminToken)
	token := uiCSRF(t, e, c)
	form := "application/x-www-form-urlencoded"
	for name, hdr := range map[string][]string{
		"no token":            {"Cookie", "sluice_ui=" + c.Value, "Content-Type", form},
		"a wrong token":       {"Cookie", "sluice_ui=" + c.Value, "Content-Type", form, "X-CSRF-Token", "x" + token},
		"the cookie as token": {"Cookie", "sluice_ui=" + c.Value, "Content-Type", form, "X-CSRF-Token", c.Value},
		"from another origin": {"Cookie", "sluice_ui=" + c.Value, "Content-Type", form, "X-CSRF-Token", token, "Origin", "https://evil.example"},
	} {
		resp, body := do(t, e, "POST", "/ui/reset", "rule=per-user&key=alice", hdr...)
		if resp.StatusCode != 403 {
			t.Errorf("reset with %s: %d %s", name, resp.StatusCode, body)
		}
	}
	if _, m := e.post("/v1/peek", `{"rule":"per-user","key":"alice"}`); m["allowed"] != false {
		t.Fatalf("alice's bucket was refilled by a forged reset: peek %v", m)
	}
	resp, body := do(t, e, "POST", "/ui/reset", "rule=per-user&key=alice&csrf="+url.QueryEscape(token), "Cookie", "sluice_ui="+c.Value, "Content-Type", form)
	if resp.StatusCode != 200 {
		t.Fatalf("reset with the session's token in the form: %d %s", resp.StatusCode, body)
	}
	if _, m := e.post("/v1/peek", `{"rule":"per-user","key":"alice"}`); m["allowed"] != true || m["remaining"] != 4.0 {
		t.Errorf("after the reset, alice's peek: %v", m)
	}
	// Without a session: the bearer token, as /v1/reset.
	resp, body = do(t, e, "POST", "/ui/reset", "rule=per-user&key=alice", "Content-Type", form)
	if resp.StatusCode != 401 {
		t.Errorf("reset without session or token: %d %s", resp.StatusCode, body)
	}
	resp, body = do(t, e, "POST", "/ui/reset", "rule=per-user&key=alice", "Content-Type", form, "Authorization", "Bearer "+adminToken)
	if resp.StatusCode != 200 {
		t.Errorf("reset with the bearer token: %d %s", resp.StatusCode, body)
	}
}

// Attack: markup searched for. The search answers the key it was given
// as JSON text, never markup a browser would run (the page sets it as
// text), under the page's headers; and a key longer than a bucket's
// bound is refused before the store is asked.
func TestAttackUISearchHostileKey(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	const evil = `<script>alert(1)</script>"&`
	e.post("/v1/take", `{"rule":"per-user","key":"<script>alert(1)</script>\"&"}`)
	auth := []string{"Authorization", "Bearer " + adminToken}
	resp, body := do(t, e, "GET", "/v1/stats/key?key="+url.QueryEscape(evil), "", auth...)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Content-Security-Policy") == "" {
		t.Fatalf("search: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if strings.ContainsAny(body, "<>") {
		t.Errorf("the answer holds markup: %s", body)
	}
	// Decoded generically, so that the test reads the wire format.
	var got struct {
		Key     string
		Buckets []struct {
			Rule, Limit, Tier string
			Capacity          float64
			Tokens            *float64
		}
		PeekError string `json:"peek_error"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil || got.Key != evil {
		t.Fatalf("search: %v %+v", err, got)
	}
	// Every limit of the policy, the tier's included; per-user spent one.
	found := 0
	for _, b := range got.Buckets {
		switch {
		case b.Limit == "api.free" && b.Rule == "api" && b.Tier == "free":
			found++
		case b.Limit == "per-user" && b.Tokens != nil && *b.Tokens == 4 && b.Capacity == 5:
			found++
		}
	}
	if len(got.Buckets) != 4 || found != 2 || got.PeekError != "" {
		t.Errorf("buckets: %+v", got)
	}
	resp, body = do(t, e, "GET", "/v1/stats/key?key="+strings.Repeat("k", 1025), "", auth...)
	if resp.StatusCode != 400 || !strings.Contains(body, "at most 1024") {
		t.Errorf("a long key: %d %s", resp.StatusCode, body)
	}
	resp, _ = do(t, e, "GET", "/v1/stats/key?key=alice", "")
	if resp.StatusCode != 401 {
		t.Errorf("search without the token: %d", resp.StatusCode)
	}
}
