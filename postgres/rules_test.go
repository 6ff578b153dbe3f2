package postgres_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/postgres"
)

// baseConfig reads plans and users from headers, as a file may when the
// proxy in front sets them.
const baseConfig = `
rules_table: {plan: "header:X-Plan", user: "header:X-User-ID"}
rules:
  - name: file-rule
    limit_keys: [ip:address]
    algorithm_config: {tokens_per_second: 10, burst: 20}
`

// capacities returns, per rule name, the burst of the limit that applies to
// a request with the given plan, user and path.
func capacities(t *testing.T, p *policy.Policy, plan, user, path string) map[string]float64 {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	r.RemoteAddr = "192.0.2.1:1234"
	if plan != "" {
		r.Header.Set("X-Plan", plan)
	}
	if user != "" {
		r.Header.Set("X-User-ID", user)
	}
	ms, err := p.Match(p.FromHTTP(r))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range ms {
		out[m.Rule.Name] = m.Request.Limit.Capacity()
	}
	return out
}

func waitFor(t *testing.T, what string, ch <-chan *policy.Policy) *policy.Policy {
	t.Helper()
	select {
	case p := <-ch:
		return p
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return nil
	}
}

func TestRulesTable(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	if _, err := p.Exec(ctx, "TRUNCATE sluice_rules RESTART IDENTITY CASCADE"); err != nil {
		t.Fatal(err)
	}
	var userNull int64
	err := p.QueryRow(ctx, `INSERT INTO sluice_rules (key_pattern, scope, rate_per_second, burst_capacity, plan, description) VALUES
  ('user:{user_id}', 'user', 1, 5, NULL, 'everyone else'),
  ('user:{user_id}', 'user', 10, 50, 'free', NULL),
  ('user:{user_id}', 'user', 100, 500, 'pro', NULL),
  ('endpoint:/api/search', 'endpoint', 1000, 2000, NULL, NULL),
  ('global', 'global', 50000, 100000, NULL, NULL),
  ('ip:{ip}', 'ip', 5, 10, NULL, NULL)
RETURNING rule_id`).Scan(&userNull)
	if err != nil {
		t.Fatal(err)
	}
	// A plan may not have two rows for one pattern, and neither may NULL.
	if _, err := p.Exec(ctx, `INSERT INTO sluice_rules (key_pattern, scope, rate_per_second, burst_capacity) VALUES ('user:{user_id}', 'user', 1, 1)`); err == nil {
		t.Fatal("a second NULL-plan row for one key_pattern was accepted")
	}

	changes := make(chan *policy.Policy, 16)
	src, err := postgres.NewPolicySource(ctx, p, postgres.PolicySourceOptions{
		Filename: "sluice.yaml", Config: []byte(baseConfig), Interval: time.Hour,
		OnChange: func(pol *policy.Policy) { changes <- pol },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	first := waitFor(t, "the first load", changes)
	if len(first.Rules) != 5 || first.Rules[0].Name != "file-rule" {
		names := []string{}
		for _, r := range first.Rules {
			names = append(names, r.Name)
		}
		t.Fatalf("rules %v, want file-rule and four from the table", names)
	}
	userRule := "db-1"
	for _, tc := range []struct {
		plan string
		want float64
	}{{"pro", 500}, {"free", 50}, {"", 5}, {"enterprise", 5}} {
		got := capacities(t, src.Policy(), tc.plan, "u1", "/api/search")
		if got[userRule] != tc.want {
			t.Errorf("plan %q: user rule burst %v, want %v (all: %v)", tc.plan, got[userRule], tc.want, got)
		}
		if got["db-4"] != 2000 || got["db-5"] != 100000 || got["db-6"] != 10 || got["file-rule"] != 20 {
			t.Errorf("plan %q: %v", tc.plan, got)
		}
	}
	if got := capacities(t, src.Policy(), "", "u1", "/other"); got["db-4"] != 0 {
		t.Errorf("the /api/search rule applied to /other: %v", got)
	}

	// A change is picked up through NOTIFY.
	if _, err := p.Exec(ctx, `UPDATE sluice_rules SET burst_capacity = 700 WHERE plan = 'pro'`); err != nil {
		t.Fatal(err)
	}
	// The LISTEN connection's own first refresh may come too, before or
	// after the update, however slow the machine: the policies before the
	// update's are passed over.
	for got := 0.0; got != 700; {
		got = capacities(t, waitFor(t, "the NOTIFY refresh with the pro burst of 700", changes), "pro", "u1", "/")[userRule]
		if got != 500 && got != 700 {
			t.Fatalf("after the update the pro burst is %v, want 700", got)
		}
	}

	// An invalid row is refused as a whole; the last good policy stays.
	good := src.Policy()
	if _, err := p.Exec(ctx, `INSERT INTO sluice_rules (key_pattern, scope, rate_per_second, burst_capacity) VALUES ('endpoint:/bad', 'endpoint', 'NaN', 3)`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for src.LastError() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the invalid row was never refused")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(src.LastError().Error(), "rate_per_second") {
		t.Fatalf("refusal %v does not name the field", src.LastError())
	}
	if src.Policy() != good {
		t.Fatal("the policy changed although the refresh was refused")
	}
	// Deactivating the bad row heals.
	if _, err := p.Exec(ctx, `UPDATE sluice_rules SET is_active = false WHERE key_pattern = 'endpoint:/bad'`); err != nil {
		t.Fatal(err)
	}
	// The rows are the good policy's again: the refresh succeeds and keeps
	// that policy rather than installing a copy of it.
	for deadline := time.Now().Add(20 * time.Second); src.LastError() != nil; {
		if time.Now().After(deadline) {
			t.Fatalf("error after the fix: %v", src.LastError())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if src.Policy() != good {
		t.Fatal("an unchanged table installed a new policy")
	}
}

// oneGlobalRow leaves sluice_rules with one row: a global limit of 10 a
// second.
func oneGlobalRow(t *testing.T, p *pgxpool.Pool) {
	t.Helper()
	ctx := pgtestContext(t)
	if _, err := p.Exec(ctx, "TRUNCATE sluice_rules RESTART IDENTITY CASCADE"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, `INSERT INTO sluice_rules (key_pattern, scope, rate_per_second, burst_capacity) VALUES ('global', 'global', 10, 10)`); err != nil {
		t.Fatal(err)
	}
}

// Without LISTEN the timer alone picks changes up.
func TestRulesTimerRefresh(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	oneGlobalRow(t, p)
	changes := make(chan *policy.Policy, 16)
	src, err := postgres.NewPolicySource(ctx, p, postgres.PolicySourceOptions{
		NoListen: true, Interval: 50 * time.Millisecond,
		OnChange: func(pol *policy.Policy) { changes <- pol },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	waitFor(t, "the first load", changes)
	if _, err := p.Exec(ctx, `UPDATE sluice_rules SET burst_capacity = 30`); err != nil {
		t.Fatal(err)
	}
	for {
		pol := waitFor(t, "a timer refresh", changes)
		if pol.Rule("db-1").Limit.Capacity() == 30 {
			return
		}
	}
}

// A refused refresh stays the last error while the row it refused is in
// the table: a load that finds nothing changed since (a timer, or a
// second notification of the same change, which the watcher may take in
// either order) says nothing about the rows.
func TestRulesSourceKeepsARefusal(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	oneGlobalRow(t, p)
	src := postgres.NewRulesSource(p, postgres.PolicySourceOptions{NoListen: true, Interval: time.Hour})
	if _, err := src.Load(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, `INSERT INTO sluice_rules (key_pattern, scope, rate_per_second, burst_capacity) VALUES ('endpoint:/bad', 'endpoint', 'NaN', 3)`); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Load(ctx, true); err == nil {
		t.Fatal("a row with a rate of NaN was accepted")
	}
	if got, err := src.Load(ctx, false); got != nil || err != nil {
		t.Fatalf("nothing changed since: %v, %v", got, err)
	}
	if src.LastError() == nil {
		t.Fatal("a load that read nothing cleared the refusal; the row is still in the table")
	}
	if _, err := p.Exec(ctx, `DELETE FROM sluice_rules WHERE key_pattern = 'endpoint:/bad'`); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Load(ctx, true); err != nil || src.LastError() != nil {
		t.Fatalf("with the row gone: %v, last error %v", err, src.LastError())
	}
}

// A source built on a config file merges the file with the table: a
// change of the file is loaded once it settles and compiled with the rows
// in force, its warnings and errors name the file's own lines, and a file
// that is refused leaves the policy as it was.
func TestRulesSourceFollowsFile(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	oneGlobalRow(t, p)
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	write := func(name string) {
		t.Helper()
		data := "rules_table: {plan: \"header:X-Plan\"}\nrules:\n  - name: " + name + "\n    algorithm_config: {rps: 1, burst: 1}\n"
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("first")
	src := postgres.NewRulesSource(p, postgres.PolicySourceOptions{File: &policy.File{Path: path}, NoListen: true, Interval: time.Hour})
	pol, err := src.Load(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if pol.Rule("first") == nil || pol.Rule("db-1") == nil {
		t.Fatalf("rules %v", pol.Rules)
	}
	if len(pol.Warnings) == 0 || !strings.HasPrefix(pol.Warnings[0], path+":1: rules_table.plan") {
		t.Errorf("warnings %q, want the file's own, with its line", pol.Warnings)
	}
	if got, err := src.Load(ctx, false); got != nil || err != nil {
		t.Fatalf("nothing changed, yet: %v %v", got, err)
	}

	write("second")
	src.Load(ctx, false) // the change seen once
	if pol, err = src.Load(ctx, false); err != nil || pol == nil || pol.Rule("second") == nil || pol.Rule("db-1") == nil {
		t.Fatalf("after the file changed: %v %v", pol, err)
	}

	if err := os.WriteFile(path, []byte("rules:\n  - name: third\n    bogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src.Load(ctx, false)
	if _, err := src.Load(ctx, false); err == nil || !strings.Contains(err.Error(), path+":3") {
		t.Fatalf("an invalid file: %v, want its error at its line 3", err)
	}
	if src.Policy() != pol {
		t.Fatal("the refused file replaced the policy")
	}
}

func TestForPlan(t *testing.T) {
	rows := []postgres.RuleRow{
		{ID: 1, KeyPattern: "a", Plan: "free"},
		{ID: 2, KeyPattern: "a", Plan: "pro"},
		{ID: 3, KeyPattern: "a"},
		{ID: 4, KeyPattern: "b", Plan: "pro"},
		{ID: 5, KeyPattern: "c"},
	}
	ids := func(rs []postgres.RuleRow) []int64 {
		var out []int64
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	for _, tc := range []struct {
		plan, def string
		want      []int64
	}{
		{"pro", "", []int64{2, 4, 5}}, {"free", "", []int64{1, 5}}, {"", "", []int64{3, 5}}, {"other", "", []int64{3, 5}},
		// default_plan: its row, where the pattern has one, before the NULL-plan row.
		{"", "pro", []int64{2, 4, 5}}, {"other", "pro", []int64{2, 4, 5}}, {"free", "pro", []int64{1, 4, 5}}, {"", "gold", []int64{3, 5}},
	} {
		if got := ids(postgres.ForPlan(rows, tc.plan, tc.def)); !slices.Equal(got, tc.want) {
			t.Errorf("plan %q, default_plan %q: %v, want %v", tc.plan, tc.def, got, tc.want)
		}
	}
}

// RuleIDs names the limits exactly as the compiled policy does, each with
// the row it came from.
func TestRuleIDs(t *testing.T) {
	rows := []postgres.RuleRow{ // as LoadRules orders them
		{ID: 9, KeyPattern: "ip:{ip}", Scope: "ip", RatePerSecond: 3, Burst: 7},
		{ID: 7, KeyPattern: "user:{user}", Scope: "user", RatePerSecond: 1, Burst: 5, Plan: "pro"},
		{ID: 3, KeyPattern: "user:{user}", Scope: "user", RatePerSecond: 2, Burst: 6},
	}
	ids := postgres.RuleIDs(rows, postgres.RulesOptions{})
	want := map[string]int64{"db-9.all-plans": 9, "db-3.pro": 7, "db-3.all-plans": 3}
	if len(ids) != len(want) {
		t.Fatalf("RuleIDs = %v, want %v", ids, want)
	}
	for name, id := range want {
		if ids[name] != id {
			t.Fatalf("RuleIDs = %v, want %v", ids, want)
		}
	}
	p, err := postgres.CompilePolicy("c.yaml", []byte("rules_table: {plan: \"header:X-Plan\", user: \"header:X-User\"}\n"), rows, postgres.RulesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range p.Rules {
		for _, tier := range r.Tiers {
			n++
			id, ok := ids[tier.Limit.Name()]
			if !ok {
				t.Fatalf("the policy's limit %q is not in RuleIDs %v", tier.Limit.Name(), ids)
			}
			var row postgres.RuleRow
			for _, rr := range rows {
				if rr.ID == id {
					row = rr
				}
			}
			if tier.Limit.Capacity() != float64(row.Burst) {
				t.Fatalf("limit %q has capacity %v, but row %d a burst of %d", tier.Limit.Name(), tier.Limit.Capacity(), id, row.Burst)
			}
		}
	}
	if n != len(want) {
		t.Fatalf("the policy has %d limits, RuleIDs %d", n, len(want))
	}
}

func TestRulesYAMLRejectsBadRows(t *testing.T) {
	for _, tc := range []struct {
		row  postgres.RuleRow
		want string
	}{
		{postgres.RuleRow{ID: 1, KeyPattern: "x", Scope: "global", RatePerSecond: 0, Burst: 1}, "rate_per_second"},
		{postgres.RuleRow{ID: 1, KeyPattern: "x", Scope: "global", RatePerSecond: 1, Burst: 0}, "burst_capacity"},
		{postgres.RuleRow{ID: 1, KeyPattern: "x", Scope: "planet", RatePerSecond: 1, Burst: 1}, "unknown scope"},
		{postgres.RuleRow{ID: 1, KeyPattern: "search", Scope: "endpoint", RatePerSecond: 1, Burst: 1}, "endpoint:/path"},
		{postgres.RuleRow{ID: 1, KeyPattern: "x", Scope: "user", RatePerSecond: 1, Burst: 1, Plan: "bad plan"}, "plan"},
		{postgres.RuleRow{ID: 1, KeyPattern: "x", Scope: "user", RatePerSecond: 1, Burst: 1}, "set rules_table.user"},
		{postgres.RuleRow{ID: 1, KeyPattern: "x", Scope: "global", RatePerSecond: 1, Burst: 1, Plan: "pro"}, "no NULL-plan row"},
	} {
		if _, err := postgres.RulesYAML([]postgres.RuleRow{tc.row}, policy.RulesTable{}, postgres.RulesOptions{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one naming %q", tc.row, err, tc.want)
		}
	}
}

func pgtestContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

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
		if policy.Enforce(pgtestContext(t), lim, ms, policy.Options{}).Allowed {
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
