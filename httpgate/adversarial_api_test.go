package httpgate_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const (
	apiTokenEnv = "SLUICE_TEST_API_TOKEN"
	apiToken    = "api-token-0123456789abcdef"
)

// closedPolicy guards the decision API and forward auth with a token. Its
// per-ip rule keys forward auth by the caller's address: 127.0.0.1 here.
const closedPolicy = `
api_token_env: ` + apiTokenEnv + `
admin_token_env: SLUICE_TEST_ADMIN
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 1, burst: 2}
`

// newClosedEnv serves closedPolicy, its token in the environment both when
// the policy loads and when the gate reads it.
func newClosedEnv(t *testing.T, yaml string) *env {
	t.Helper()
	t.Setenv(apiTokenEnv, apiToken)
	e := newEnv(t, yaml)
	e.env[apiTokenEnv] = apiToken
	return e
}

// wantUnauthorized checks a 401 problem with a Bearer challenge.
func wantUnauthorized(t *testing.T, what string, resp *http.Response, m map[string]any) {
	t.Helper()
	if resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer ") ||
		resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(m["detail"].(string), "token") {
		t.Errorf("%s: %d %v %v", what, resp.StatusCode, resp.Header, m)
	}
}

// Attack: anyone who reaches the decision API drains anyone's bucket.
// POST /v1/take {"rule":"per-ip","key":<victim's address>,"cost":<burst>}
// made the victim's next forward-auth call a 429 (and minted keys at will).
// With api_token_env set, a take without the token, or with a wrong one, is
// a 401 that charges nothing, so the victim is still admitted.
func TestAttackDrainAnothersBucketNeedsToken(t *testing.T) {
	e := newClosedEnv(t, closedPolicy)
	drain := `{"rule":"per-ip","key":"127.0.0.1","cost":2}`
	for _, hdr := range [][]string{
		nil,
		{"Authorization", "Bearer wrong-token-0123456789abcdef"},
		{"Authorization", "Bearer " + apiToken + "x"},
		{"Authorization", "Basic " + apiToken},
		{"Authorization", apiToken},
		// The forward-auth header does not open /v1/take: one way in per endpoint.
		{"X-Sluice-Token", apiToken},
	} {
		resp, m := e.post("/v1/take", drain, hdr...)
		wantUnauthorized(t, "take with "+strings.Join(hdr, ": "), resp, m)
		resp, m = e.post("/v1/peek", drain, hdr...)
		wantUnauthorized(t, "peek with "+strings.Join(hdr, ": "), resp, m)
	}
	if n := e.store.Len(); n != 0 {
		t.Fatalf("refused takes created %d keys", n)
	}
	// The victim (127.0.0.1 through forward auth) keeps its whole burst.
	for i := 0; i < 2; i++ {
		if resp, m := e.get("/v1/auth", "X-Sluice-Token", apiToken); resp.StatusCode != 200 {
			t.Fatalf("victim's request %d: %d %v", i, resp.StatusCode, m)
		}
	}

	// The token's holder is served; the scheme is case-insensitive.
	for _, scheme := range []string{"Bearer ", "bearer ", "BEARER  "} {
		resp, m := e.post("/v1/peek", `{"rule":"per-ip","key":"10.0.0.1"}`, "Authorization", scheme+apiToken)
		if resp.StatusCode != 200 || m["allowed"] != true {
			t.Errorf("peek with %q: %d %v", scheme, resp.StatusCode, m)
		}
	}
	resp, m := e.post("/v1/take", `{"rule":"per-ip","key":"10.0.0.1","cost":2}`, "Authorization", "Bearer "+apiToken)
	if resp.StatusCode != 200 || m["allowed"] != true {
		t.Errorf("take with the token: %d %v", resp.StatusCode, m)
	}
}

// Attack: calling forward auth directly, past the front proxy. With
// api_token_env set, /v1/auth wants X-Sluice-Token, which the front proxy
// adds; the Authorization header is the client's own and opens nothing,
// even when it carries the API token.
func TestAttackForwardAuthNeedsToken(t *testing.T) {
	e := newClosedEnv(t, closedPolicy)
	for _, hdr := range [][]string{
		nil,
		{"X-Sluice-Token", "wrong-token-0123456789abcdef"},
		{"X-Sluice-Token", ""},
		{"Authorization", "Bearer " + apiToken},
	} {
		resp, m := e.get("/v1/auth", hdr...)
		wantUnauthorized(t, "auth with "+strings.Join(hdr, ": "), resp, m)
	}
	if n := e.store.Len(); n != 0 {
		t.Fatalf("refused calls created %d keys", n)
	}
	// Health stays open, for load balancers and probes.
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp, _ := e.get(p); resp.StatusCode != 200 {
			t.Errorf("%s: %d", p, resp.StatusCode)
		}
	}
}

// The token for forward auth travels beside the client's Authorization
// header, so JWT rules still read the client's own token.
func TestForwardAuthTokenKeepsClientJWT(t *testing.T) {
	const secret = "test-secret-0123456789abcdef0123456789"
	t.Setenv("SLUICE_JWT_SECRET", secret)
	e := newClosedEnv(t, `
api_token_env: `+apiTokenEnv+`
jwt: {hmac_secret_env: SLUICE_JWT_SECRET}
rules:
  - name: per-user
    limit_keys: ["jwt:sub"]
    algorithm_config: {rps: 1, burst: 1}
`)
	exp := time.Now().Add(time.Hour).Unix()
	alice := signHS256(t, secret, jwt.MapClaims{"sub": "alice", "exp": exp})
	bob := signHS256(t, secret, jwt.MapClaims{"sub": "bob", "exp": exp})
	status := func(tok string) int {
		resp, _ := e.get("/v1/auth", "X-Sluice-Token", apiToken, "Authorization", "Bearer "+tok)
		return resp.StatusCode
	}
	if a1, a2, b1 := status(alice), status(alice), status(bob); a1 != 200 || a2 != 429 || b1 != 200 {
		t.Fatalf("alice %d then %d, bob %d: want 200, 429, 200 (one bucket per verified subject)", a1, a2, b1)
	}
}

// Attack (RFC 9110 section 11.1: the auth scheme is case-insensitive):
// /v1/reset refused "bearer TOKEN" that /v1/auth's JWT reading accepts.
// One parser reads bearer tokens everywhere now.
func TestAttackLowercaseBearerReset(t *testing.T) {
	e := newEnv(t, apiPolicy)
	e.env["SLUICE_TEST_ADMIN"] = "s3cret-token"
	for _, auth := range []string{"bearer s3cret-token", "BEARER s3cret-token", "Bearer  s3cret-token"} {
		resp, m := e.post("/v1/reset", `{"rule":"per-user","key":"u1"}`, "Authorization", auth)
		if resp.StatusCode != 200 {
			t.Errorf("Authorization %q: %d %v", auth, resp.StatusCode, m)
		}
	}
	for _, auth := range []string{"bearers3cret-token", "Bearer", "Token s3cret-token"} {
		resp, m := e.post("/v1/reset", `{"rule":"per-user","key":"u1"}`, "Authorization", auth)
		if resp.StatusCode != 401 {
			t.Errorf("Authorization %q: %d %v", auth, resp.StatusCode, m)
		}
	}
}

// Attack: a finite cost too large for the arithmetic's range (1e308) got a
// 400 "invalid cost" where every other cost above the burst gets the 422
// that tells the caller no wait will ever help.
func TestAttackHugeFiniteCost(t *testing.T) {
	e := newEnv(t, apiPolicy)
	for _, body := range []string{
		`{"rule":"per-user","key":"u","cost":1e308}`,
		`{"rule":"per-user","key":"u","cost":1.7976931348623157e308}`,
		`{"rule":"per-user","key":"u","cost":1e20}`,
		`{"takes":[{"rule":"per-org","key":"x"},{"rule":"per-user","key":"u","cost":1e308}]}`,
	} {
		for _, path := range []string{"/v1/take", "/v1/peek"} {
			resp, m := e.post(path, body)
			if resp.StatusCode != 422 || resp.Header.Get("Content-Type") != "application/problem+json" ||
				!strings.Contains(m["detail"].(string), "can never succeed") {
				t.Errorf("%s %s: %d %v", path, body, resp.StatusCode, m)
			}
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Errorf("refused costs created %d keys", n)
	}
}

// Attack: the decision API reachable wherever forward auth is. Split, the
// listener facing the front proxy serves forward auth and health only, and
// the decision API's listener serves no forward auth.
func TestAttackAPISplitServesOnlyItsEndpoints(t *testing.T) {
	e := newEnv(t, apiPolicy)
	e.env["SLUICE_TEST_ADMIN"] = "s3cret-token"
	auth := httptest.NewServer(e.gate.AuthHandler())
	t.Cleanup(auth.Close)
	api := httptest.NewServer(e.gate.APIHandler())
	t.Cleanup(api.Close)
	do := func(base, method, path, body string) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer s3cret-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	take := `{"rule":"per-user","key":"u1"}`
	for _, c := range []struct {
		base, method, path string
		want               int
	}{
		{auth.URL, "POST", "/v1/take", 404},
		{auth.URL, "POST", "/v1/peek", 404},
		{auth.URL, "POST", "/v1/reset", 404},
		{auth.URL, "GET", "/metrics", 404},
		{auth.URL, "GET", "/v1/auth", 200},
		{auth.URL, "GET", "/healthz", 200},
		{auth.URL, "GET", "/readyz", 200},
		{api.URL, "GET", "/v1/auth", 404},
		{api.URL, "POST", "/v1/auth", 404},
		{api.URL, "POST", "/v1/take", 200},
		{api.URL, "POST", "/v1/peek", 200},
		{api.URL, "POST", "/v1/reset", 200},
		{api.URL, "GET", "/metrics", 200},
		{api.URL, "GET", "/healthz", 200},
	} {
		if got := do(c.base, c.method, c.path, take); got != c.want {
			name := "auth"
			if c.base == api.URL {
				name = "api"
			}
			t.Errorf("%s listener: %s %s: %d, want %d", name, c.method, c.path, got, c.want)
		}
	}
}

// Attack: a take without a key shared one bucket with every other caller
// that left it out. {"rule":"per-org"} was the empty key's bucket: one
// caller's omission drained it for all of them (and a typo, "kye", is an
// unknown field, but a forgotten key was silently everyone's). A take or
// reset without a key, or with an empty one, is a 400 that charges
// nothing.
func TestAttackMissingKeySharesOneBucket(t *testing.T) {
	e := newEnv(t, apiPolicy)
	e.env["SLUICE_TEST_ADMIN"] = "s3cret-token"
	for _, c := range []struct{ path, body string }{
		{"/v1/take", `{"rule":"per-org","cost":10}`},
		{"/v1/take", `{"rule":"per-org","key":"","cost":10}`},
		{"/v1/take", `{"rule":"per-org","key":null,"cost":10}`},
		{"/v1/take", `{"takes":[{"rule":"per-user","key":"u"},{"rule":"per-org","cost":10}]}`},
		{"/v1/peek", `{"rule":"per-org"}`},
		{"/v1/reset", `{"rule":"per-org"}`},
	} {
		resp, m := e.post(c.path, c.body, "Authorization", "Bearer s3cret-token")
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(m["detail"].(string), `"key" is required`) {
			t.Errorf("%s %s: %d %v", c.path, c.body, resp.StatusCode, m)
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Errorf("takes without a key created %d keys", n)
	}
}

// Attack: Envoy's ext_authz path, /v1/auth/..., was served before the
// token check and on every listener: with api_token_env set, GET
// /v1/auth/login without the token was judged (and charged) like a front
// proxy's call, and the decision API's own listener (api_listen), which
// serves no forward auth, answered it too. It needs the token, and is
// served only where /v1/auth is.
func TestAttackForwardAuthSubpathSkipsToken(t *testing.T) {
	e := newClosedEnv(t, closedPolicy)
	for _, hdr := range [][]string{nil, {"X-Sluice-Token", "wrong-token-0123456789abcdef"}, {"Authorization", "Bearer " + apiToken}} {
		for _, path := range []string{"/v1/auth/login", "/v1/auth//x", "/v1/auth/../v1/take"} {
			req, _ := http.NewRequest("GET", e.srv.URL+path, nil)
			req.URL.Opaque = path // as sent, not cleaned by the client
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			resp, m := e.do(req)
			wantUnauthorized(t, path+" with "+strings.Join(hdr, ": "), resp, m)
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Fatalf("refused calls created %d keys", n)
	}
	if resp, m := e.get("/v1/auth/login", "X-Sluice-Token", apiToken); resp.StatusCode != 200 {
		t.Errorf("with the token: %d %v", resp.StatusCode, m)
	}

	api := httptest.NewServer(e.gate.APIHandler())
	t.Cleanup(api.Close)
	before := e.store.Len()
	req, _ := http.NewRequest("GET", api.URL+"/v1/auth/login", nil)
	req.Header.Set("X-Sluice-Token", apiToken)
	if resp, m := e.do(req); resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("decision API listener: /v1/auth/login: %d %v", resp.StatusCode, m)
	}
	if n := e.store.Len(); n != before {
		t.Errorf("the decision API listener judged a forward-auth call (%d keys, %d before)", n, before)
	}
}

// Attack: the decision API repeated an unknown rule name whole: a 60 KiB
// name came back in a 60 KiB problem, from every request, to whatever
// reads the answers (or logs them). The name is cut to its start, and a
// name no edit could bring within reach of a rule costs no comparisons.
func TestAttackUnknownRuleReflected(t *testing.T) {
	e := newEnv(t, apiPolicy)
	e.env["SLUICE_TEST_ADMIN"] = "s3cret-token"
	long := strings.Repeat("<script>", 60<<10/8)
	for _, path := range []string{"/v1/take", "/v1/peek", "/v1/reset"} {
		resp, m := e.post(path, `{"rule":"`+long+`","key":"k"}`, "Authorization", "Bearer s3cret-token")
		d, _ := m["detail"].(string)
		if resp.StatusCode != 400 || len(d) > 1024 || !strings.Contains(d, "unknown rule") || !strings.Contains(d, "per-user") {
			t.Errorf("%s: %d, detail of %d bytes: %.200q", path, resp.StatusCode, len(d), d)
		}
	}
}

// Attack: on a sharded rule with on_store_error: allow, a caller of the
// decision API asks for a cost within the burst but above what two
// shards hold together. Judged against the burst alone, the limiter
// would refuse it, that refusal would be taken for a store failure, and
// on_store_error: allow would answer allowed, charging nothing, every
// time. It must be the 422 of a cost that can never succeed.
func TestAttackShardedCostAboveTwoShards(t *testing.T) {
	e := newEnv(t, `rules:
  - name: hot
    on_store_error: allow
    algorithm_config: {rps: 10, burst: 100, shards: 10}
`)
	for _, path := range []string{"/v1/take", "/v1/peek"} {
		resp, m := e.post(path, `{"rule":"hot","key":"*","cost":50}`)
		detail, _ := m["detail"].(string)
		if resp.StatusCode != 422 || !strings.Contains(detail, "what two of its 10 shards hold together (20") || !strings.Contains(detail, "can never succeed") {
			t.Errorf("%s cost 50 of 10 shards of 10: %d %v", path, resp.StatusCode, m)
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Errorf("refused costs created %d keys", n)
	}
	if resp, m := e.post("/v1/take", `{"rule":"hot","key":"*","cost":20}`); resp.StatusCode != 200 || m["allowed"] != true || m["limit"] != float64(100) {
		t.Errorf("cost 20, what two full shards hold: %d %v", resp.StatusCode, m)
	}
}

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
