package postgres_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/postgres"
)

const attackSecret = "0123456789abcdef0123456789abcdef-attack-secret"

// jwtSection verifies HS256 tokens signed with attackSecret.
const jwtSection = "jwt: {hmac_secret_env: SLUICE_ATTACK_JWT}\n"

// tableSource fills sluice_rules with rows, given as the VALUES of
// (key_pattern, scope, rate_per_second, burst_capacity, plan), and
// compiles config with them as serve does; the error is the source's
// refusal.
func tableSource(t *testing.T, config, rows string) (*postgres.PolicySource, error) {
	t.Helper()
	t.Setenv("SLUICE_ATTACK_JWT", attackSecret)
	p := pool(t)
	ctx := pgtestContext(t)
	if _, err := p.Exec(ctx, "TRUNCATE sluice_rules RESTART IDENTITY CASCADE"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, "INSERT INTO sluice_rules (key_pattern, scope, rate_per_second, burst_capacity, plan) VALUES "+rows); err != nil {
		t.Fatal(err)
	}
	src, err := postgres.NewPolicySource(ctx, p, postgres.PolicySourceOptions{
		Filename: "sluice.yaml", Config: []byte(config), Interval: time.Hour, NoListen: true,
	})
	if err == nil {
		t.Cleanup(src.Close)
	}
	return src, err
}

func mustTableSource(t *testing.T, config, rows string) *postgres.PolicySource {
	t.Helper()
	src, err := tableSource(t, config, rows)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// admitted sends n requests, the i-th built by req, through the policy
// of src and Enforce on a fresh PostgreSQL store whose clock stands
// still, and counts the admitted ones.
func admitted(t *testing.T, src *postgres.PolicySource, n int, req func(i int) *http.Request) int {
	t.Helper()
	lim := sluice.New(newStore(t, sluice.NewManualClock(time.Unix(1_700_000_000, 0))))
	pol := src.Policy()
	got := 0
	for i := 0; i < n; i++ {
		ms, err := pol.Match(pol.FromHTTP(req(i)))
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) == 0 {
			t.Fatalf("request %d: no rule of the table applies", i)
		}
		if policy.Enforce(pgtestContext(t), lim, sluice.OpTake, ms, nil).Allowed {
			got++
		}
	}
	return got
}

// request is a GET from one client address with the given headers
// (name, value, name, value...).
func request(headers ...string) *http.Request {
	r := httptest.NewRequest("GET", "/api", nil)
	r.RemoteAddr = "192.0.2.9:4321"
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	return r
}

func bearer(t *testing.T, claims jwt.MapClaims) string {
	t.Helper()
	claims["exp"] = time.Now().Add(time.Hour).Unix()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(attackSecret))
	if err != nil {
		t.Fatal(err)
	}
	return "Bearer " + s
}

// Attack: the rules table took a request's plan from the client's X-Plan
// header, so `X-Plan: enterprise` moved a free client onto the
// enterprise row. The plan now comes only from a source the config names:
// with a jwt section the verified jwt:plan, without one none at all.
func TestAttackForgedPlanHeader(t *testing.T) {
	rows := `('global', 'global', 1, 5, NULL), ('global', 'global', 1, 1000, 'enterprise')`
	forged := func(int) *http.Request { return request("X-Plan", "enterprise") }
	for _, config := range []string{"listen: \":8080\"\n", jwtSection} {
		src := mustTableSource(t, config, rows)
		if got := admitted(t, src, 20, forged); got != 5 {
			t.Errorf("config %q: %d of 20 requests with a forged X-Plan: enterprise passed; want the NULL-plan row's burst of 5", config, got)
		}
	}
	// A verified enterprise token does reach the enterprise row.
	src := mustTableSource(t, jwtSection, rows)
	token := bearer(t, jwt.MapClaims{"sub": "acme", "plan": "enterprise"})
	if got := admitted(t, src, 20, func(int) *http.Request { return request("Authorization", token) }); got != 20 {
		t.Errorf("a verified enterprise plan got %d of 20 through the enterprise row", got)
	}
}

// Attack: user-scope rows were keyed by the client's X-User-ID header, so
// a new value was a fresh bucket. Users now come from the verified
// jwt:sub by default, from a source the config names, or nowhere: then a
// user-scope row is refused rather than keyed by a header.
func TestAttackForgedUserID(t *testing.T) {
	rows := `('user:{user_id}', 'user', 1, 5, NULL)`
	token := bearer(t, jwt.MapClaims{"sub": "alice"})
	rotate := func(i int) *http.Request {
		return request("Authorization", token, "X-User-ID", fmt.Sprintf("fresh-%d", i))
	}
	if got := admitted(t, mustTableSource(t, jwtSection, rows), 20, rotate); got != 5 {
		t.Errorf("%d of 20 requests of one verified user with a new X-User-ID each passed; want the burst of 5", got)
	}
	if got := admitted(t, mustTableSource(t, "rules_table: {user: \"ip:address\"}\n", rows), 20, rotate); got != 5 {
		t.Errorf("user: ip:address: %d of 20 requests from one address passed; want 5", got)
	}
	_, err := tableSource(t, "listen: \":8080\"\n", rows)
	if err == nil || !strings.Contains(err.Error(), "rules_table.user") {
		t.Errorf("a user-scope row with no source of users: error %v, want a refusal naming rules_table.user", err)
	}
}

// Attack: a plan with no row of a key pattern (X-Plan: bogus) escaped a
// pattern that had no NULL-plan row: no tier matched, so the pattern did
// not apply. Such a request now takes the row of default_plan, else the
// NULL-plan row, and a pattern with neither is refused.
func TestAttackUnknownPlanEscapes(t *testing.T) {
	rows := `('global', 'global', 1, 5, 'free'), ('global', 'global', 1, 50, 'pro')`
	_, err := tableSource(t, jwtSection, rows)
	if err == nil || !strings.Contains(err.Error(), "no NULL-plan row") {
		t.Fatalf("a key pattern that leaves unknown plans unlimited: error %v, want a refusal", err)
	}
	src := mustTableSource(t, "trusted_proxies: [192.0.2.9]\nrules_table: {plan: \"header:X-Plan\", default_plan: free}\n", rows)
	for _, plan := range []string{"bogus", ""} {
		if got := admitted(t, src, 20, func(int) *http.Request { return request("X-Plan", plan) }); got != 5 {
			t.Errorf("X-Plan %q: %d of 20 passed; want default_plan free's burst of 5", plan, got)
		}
	}
	if got := admitted(t, src, 20, func(int) *http.Request { return request("X-Plan", "pro") }); got != 20 {
		t.Errorf("X-Plan pro: %d of 20 passed the pro row (burst 50)", got)
	}
	src = mustTableSource(t, "trusted_proxies: [192.0.2.9]\nrules_table: {plan: \"header:X-Plan\"}\n", rows+`, ('global', 'global', 1, 3, NULL)`)
	if got := admitted(t, src, 20, func(int) *http.Request { return request("X-Plan", "bogus") }); got != 3 {
		t.Errorf("X-Plan bogus: %d of 20 passed; want the NULL-plan row's burst of 3", got)
	}
}
