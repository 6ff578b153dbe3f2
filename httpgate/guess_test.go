package httpgate_test

import (
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"
)

// Attack: guessing the API token with no limit on wrong guesses. Right
// tokens cost nothing, however many; after 10 wrong ones from an address,
// the right token is refused unread too (429, Retry-After) until the
// address's guesses refill.
func TestAttackAPITokenGuessesLimited(t *testing.T) {
	e := newClosedEnv(t, closedPolicy)
	peek := `{"rule":"per-ip","key":"10.0.0.1"}`
	for i := range 50 {
		if resp, m := e.post("/v1/peek", peek, "Authorization", "Bearer "+apiToken); resp.StatusCode != 200 {
			t.Fatalf("right token %d: %d %v", i, resp.StatusCode, m)
		}
	}
	for i := range 10 {
		resp, m := e.post("/v1/peek", peek, "Authorization", "Bearer wrong-token-0123456789-"+strconv.Itoa(i))
		wantUnauthorized(t, "wrong guess", resp, m)
	}
	resp, _ := e.post("/v1/peek", peek, "Authorization", "Bearer "+apiToken)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the right token after 10 wrong guesses: %d, Retry-After %q; want 429 unread", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	e.clk.Advance(time.Minute)
	if resp, m := e.post("/v1/peek", peek, "Authorization", "Bearer "+apiToken); resp.StatusCode != 200 {
		t.Fatalf("the right token a minute later: %d %v", resp.StatusCode, m)
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
