package httpgate_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/memory"
)

// Attacks on the live page (/ui) and its data (/v1/stats), which show
// whose traffic is limited: client addresses, user ids, API keys.

// do sends method path with a body and headers (pairs), without following
// redirects, and returns the answer and its body.
func do(t *testing.T, e *env, method, path, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// login trades the token for the session cookie through /ui?token=.
func login(t *testing.T, e *env, token string) *http.Cookie {
	t.Helper()
	resp, _ := do(t, e, "GET", "/ui?token="+url.QueryEscape(token), "")
	for _, c := range resp.Cookies() {
		if c.Name == "sluice_ui" {
			return c
		}
	}
	t.Fatalf("no session cookie: %d %v", resp.StatusCode, resp.Header)
	return nil
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

// Attack: the upstream behind sluice's reverse proxy reads the operator's
// session. Browsers send a host's cookies to all of its ports, so an
// operator who uses the proxied application on the same host hands it
// the session cookie; the proxy drops it and passes the others.
func TestAttackProxyForwardsSessionCookie(t *testing.T) {
	var mu sync.Mutex
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Values("Cookie")...)
		mu.Unlock()
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	g := httpgate.New(mustPolicy(t, "rules:\n  - name: all\n    algorithm_config: {rps: 1000, burst: 1000}\n"), sluice.New(memory.New(memory.Options{})), httpgate.Options{})
	front := httptest.NewServer(g.Proxy(u, httpgate.ProxyOptions{}))
	defer front.Close()
	req, _ := http.NewRequest("GET", front.URL+"/app", nil)
	req.Header.Add("Cookie", "app=1; sluice_ui=123.session; theme=dark")
	req.Header.Add("Cookie", "sluice_ui=again")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, "; ") != "app=1; theme=dark" {
		t.Errorf("the upstream got cookies %q", got)
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

func (p *peekCounter) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Request, _ []sluice.Decision) ([]sluice.Decision, error) {
	if op == engine.OpPeek {
		p.record(len(rs))
	}
	return p.Store.TakeAll(ctx, op, rs, nil)
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

// Attack: guessing the admin token at /ui/login as fast as the server
// answers, with no limit on wrong guesses. An address gets GuessBurst
// wrong tokens, then every token it presents, the right one included,
// is refused unread with a 429 and a Retry-After, wherever the admin
// token is taken (the login form, ?token=, a bearer token on /v1/stats,
// /v1/reset). A session opened before keeps working, and the wait ends.
func TestAttackLoginGuessesLimited(t *testing.T) {
	const burst, period = 10, time.Minute // burst, GuessPeriod
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	session := login(t, e, adminToken) // a right token costs no guess
	form := "application/x-www-form-urlencoded"
	for i := range burst {
		resp, _ := do(t, e, "POST", "/ui/login", "token=wrong-guess-"+strconv.Itoa(i), "Content-Type", form)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong guess %d: %d, want 401", i+1, resp.StatusCode)
		}
	}
	refused := func(what string, resp *http.Response) {
		t.Helper()
		ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != http.StatusTooManyRequests || ra < 1 || len(resp.Cookies()) != 0 {
			t.Errorf("%s after %d wrong guesses: %d, Retry-After %q, cookies %v; want 429 unread, no session",
				what, burst, resp.StatusCode, resp.Header.Get("Retry-After"), resp.Cookies())
		}
	}
	resp, _ := do(t, e, "POST", "/ui/login", "token="+url.QueryEscape(adminToken), "Content-Type", form)
	refused("the right token at /ui/login", resp)
	resp, _ = do(t, e, "GET", "/ui?token="+url.QueryEscape(adminToken), "")
	refused("the right token as ?token=", resp)
	resp, _ = do(t, e, "GET", "/v1/stats", "", "Authorization", "Bearer "+adminToken)
	refused("the right bearer token on /v1/stats", resp)
	resp, _ = do(t, e, "POST", "/v1/reset", `{"rule":"per-user","key":"u"}`, "Authorization", "Bearer "+adminToken)
	refused("the right token on /v1/reset", resp)
	if resp, _ := do(t, e, "GET", "/v1/stats", "", "Cookie", session.Name+"="+session.Value); resp.StatusCode != 200 {
		t.Errorf("a session opened before the guesses: %d, want 200", resp.StatusCode)
	}
	// The bucket refills at GuessBurst per GuessPeriod.
	e.clk.Advance(period)
	if resp, _ := do(t, e, "GET", "/v1/stats", "", "Authorization", "Bearer "+adminToken); resp.StatusCode != 200 {
		t.Errorf("the right token a period later: %d, want 200", resp.StatusCode)
	}
}
