package httpgate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/httpgate"
)

// twoSlotRules are two concurrency rules of one slot each, keyed by the
// decision API's key.
const twoSlotRules = `
api_token_env: ` + apiTokenEnv + `
rules:
  - name: jobs
    algorithm: concurrency
    algorithm_config: {max_in_flight: 1}
  - name: exports
    algorithm: concurrency
    algorithm_config: {max_in_flight: 1}
`

// takeLease takes a slot of rule under key through the decision API and
// returns its lease.
func takeLease(e *env, rule, key string, hdr ...string) string {
	e.t.Helper()
	_, m := e.post("/v1/take", fmt.Sprintf(`{"rule":%q,"key":%q}`, rule, key), hdr...)
	lease, _ := m["lease"].(string)
	if m["allowed"] != true || len(lease) != 32 {
		e.t.Fatalf("take %s/%s: %v; want allowed with a lease", rule, key, m)
	}
	return lease
}

// Attack: free another caller's slot by guessing its lease, or by
// replaying a lease of one's own under another key or another rule, so
// as to run more than max_in_flight at once. A lease is 128 random bits
// bound to its rule and key: none of these frees anything.
func TestAttackForgedLeaseFreesNothing(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules)
	auth := []string{"Authorization", "Bearer " + apiToken}
	victim := takeLease(e, "jobs", "victim", auth...)
	mine := takeLease(e, "jobs", "attacker", auth...)
	other := takeLease(e, "exports", "victim", auth...)

	forged := []string{
		"00000000000000000000000000000000",
		"ffffffffffffffffffffffffffffffff",
		engine.NewLeaseID().String(),
		strings.ToUpper(mine),          // the attacker's own lease, another key
		other,                          // the victim's lease of another rule
		victim[:31] + flip(victim[31]), // one bit off the victim's
	}
	for _, lease := range forged {
		resp, m := e.post("/v1/release", fmt.Sprintf(`{"rule":"jobs","key":"victim","lease":%q}`, lease), auth...)
		if resp.StatusCode != 200 || m["released"] != false {
			t.Fatalf("release of victim's slot with lease %s: %d %v; want 200 released=false", lease, resp.StatusCode, m)
		}
	}
	if got := e.slotsFree("jobs", "victim"); got != 0 {
		t.Fatalf("forged releases freed the victim's slot (%d free)", got)
	}
	if got := e.slotsFree("exports", "victim"); got != 0 {
		t.Fatalf("a lease of jobs freed a slot of exports (%d free)", got)
	}
	// The real lease, and only it, frees the slot.
	_, m := e.post("/v1/release", fmt.Sprintf(`{"rule":"jobs","key":"victim","lease":%q}`, victim), auth...)
	wantFields(t, m, map[string]any{"released": true, "remaining": 1})
}

func flip(c byte) string {
	if c == '0' {
		return "1"
	}
	return "0"
}

// Attack: choose one's own lease id at take time (to know, or to collide
// with, another caller's), or take less than a slot with a fractional
// cost, or reserve a slot for later. The take of a concurrency rule
// accepts none of these: the id is drawn by the server, and a take holds
// exactly one slot, now.
func TestAttackTakeCannotChooseLeaseOrWeight(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules)
	auth := []string{"Authorization", "Bearer " + apiToken}
	for _, body := range []string{
		`{"rule":"jobs","key":"k","lease":"00000000000000000000000000000001"}`,
		`{"rule":"jobs","key":"k","cost":0.5}`,
		`{"rule":"jobs","key":"k","cost":0.000001}`,
		`{"rule":"jobs","key":"k","cost":2}`,
		`{"rule":"jobs","key":"k","reserve":true}`,
		`{"takes":[{"rule":"jobs","key":"k","cost":0.5}]}`,
	} {
		resp, m := e.post("/v1/take", body, auth...)
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("take %s: %d %v; want a 400 problem", body, resp.StatusCode, m)
		}
		wantNoInternals(t, fmt.Sprint(m["detail"]))
	}
	if got := e.slotsFree("jobs", "k"); got != 1 {
		t.Fatalf("refused takes held a slot (%d free)", got)
	}
}

// Attack: take a slot without /v1/take's lease, or keep another caller's
// slot past its lease, through /v1/renew: renew a lease id of one's own
// choosing (to hold a slot under an id one knows, or one another caller
// might send), one's own lease under another key or rule, or a guess at
// the victim's. A renewal acts only on a live lease the server drew for
// that rule and key: none of these holds or extends anything.
func TestAttackRenewAcquiresNothing(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules)
	auth := []string{"Authorization", "Bearer " + apiToken}
	mine := takeLease(e, "jobs", "attacker", auth...)
	other := takeLease(e, "exports", "free", auth...)
	chosen := []string{
		"00000000000000000000000000000000",
		"00000000000000000000000000000001",
		"ffffffffffffffffffffffffffffffff",
		engine.NewLeaseID().String(),
		mine,  // the attacker's own lease, another key
		other, // a lease of another rule
	}
	for _, lease := range chosen {
		resp, m := e.post("/v1/renew", fmt.Sprintf(`{"rule":"jobs","key":"free","lease":%q}`, lease), auth...)
		if resp.StatusCode != 200 || m["renewed"] != false {
			t.Fatalf("renew of a free key's slot with lease %s: %d %v; want 200 renewed=false", lease, resp.StatusCode, m)
		}
	}
	if got := e.slotsFree("jobs", "free"); got != 1 {
		t.Fatalf("renewals of leases never taken under the key took a slot (%d free)", got)
	}
	// The victim's lease is not kept alive by forged renewals: it ends
	// when its own lease does.
	victim := takeLease(e, "jobs", "victim", auth...)
	for _, lease := range append(chosen, strings.ToUpper(mine), victim[:31]+flip(victim[31])) {
		e.clk.Advance(20 * e.gate.Policy().Limit("jobs").LeaseTerm() / 100)
		e.post("/v1/renew", fmt.Sprintf(`{"rule":"jobs","key":"victim","lease":%q}`, lease), auth...)
	}
	e.clk.Advance(e.gate.Policy().Limit("jobs").LeaseTerm())
	if got := e.slotsFree("jobs", "victim"); got != 1 {
		t.Fatalf("forged renewals kept the victim's slot past its lease (%d free)", got)
	}
}

// Attack: free slots without the API token (a caller outside the trusted
// services releasing every lease it can find). /v1/release needs the
// token that /v1/take needs.
func TestAttackReleaseNeedsToken(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules)
	lease := takeLease(e, "jobs", "k", "Authorization", "Bearer "+apiToken)
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"X-Sluice-Token", apiToken}} {
		for _, path := range []string{"/v1/release", "/v1/renew"} {
			resp, _ := e.post(path, fmt.Sprintf(`{"rule":"jobs","key":"k","lease":%q}`, lease), hdr...)
			if resp.StatusCode != 401 {
				t.Fatalf("%s with %v: %d, want 401", path, hdr, resp.StatusCode)
			}
		}
	}
	if got := e.slotsFree("jobs", "k"); got != 0 {
		t.Fatal("a release without the token freed the slot")
	}
}

// Attack: malformed releases (a lease that is no lease, a rule that holds
// no slots, a missing field) must be refused with a reason, never freeing
// a slot or showing the server's internals.
func TestAttackMalformedRelease(t *testing.T) {
	e := newClosedEnv(t, twoSlotRules+`
  - name: rate
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 1}
`)
	auth := []string{"Authorization", "Bearer " + apiToken}
	takeLease(e, "jobs", "k", auth...)
	for _, body := range []string{
		`{"rule":"jobs","key":"k"}`,
		`{"rule":"jobs","key":"k","lease":""}`,
		`{"rule":"jobs","key":"k","lease":"xyz"}`,
		`{"rule":"jobs","key":"k","lease":"0000000000000000000000000000000g"}`,
		`{"rule":"jobs","key":"k","lease":"000000000000000000000000000000000"}`,
		`{"rule":"jobs","key":"k","lease":12}`,
		`{"rule":"jobs","lease":"00000000000000000000000000000000"}`,
		`{"rule":"rate","key":"k","lease":"00000000000000000000000000000000"}`,
		`{"rule":"nope","key":"k","lease":"00000000000000000000000000000000"}`,
		`{"rule":"jobs","key":"k","lease":"00000000000000000000000000000000","extra":1}`,
	} {
		for _, path := range []string{"/v1/release", "/v1/renew"} {
			resp, m := e.post(path, body, auth...)
			if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%s %s: %d %v; want a 400 problem", path, body, resp.StatusCode, m)
			}
			wantNoInternals(t, fmt.Sprint(m["detail"]))
		}
	}
	if got := e.slotsFree("jobs", "k"); got != 0 {
		t.Fatal("a malformed release freed the slot")
	}
}

// Attack: hold every slot of a key by opening requests and dropping them
// (a client that connects, is admitted and vanishes, again and again). The
// proxy frees a slot as soon as its client goes away, so slots cannot be
// hoarded by abandoned requests.
func TestAttackAbandonedRequestsHoldNoSlot(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: two
    algorithm: concurrency
    limit_keys: ["header:x-api-key"]
    algorithm_config: {max_in_flight: 2}
`)
	up := newHoldingUpstream(t)
	proxy := e.proxyTo(up.URL, httpgate.ProxyOptions{})
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 2)
		for range 2 {
			go func() {
				_, _, err := getWith(t, ctx, proxy.URL+"/hold", "k")
				errc <- err
			}()
		}
		<-up.arrived
		<-up.arrived
		cancel() // both clients vanish
		<-errc
		<-errc
		e.waitFree("two", "k", 2)
	}
}

// Attack: pass a concurrency rule through forward auth, which would
// otherwise hand out slots it can never take back (or skip the rule):
// the request is refused, and nothing is held.
func TestAttackForwardAuthCannotBypassConcurrency(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: one
    algorithm: concurrency
    algorithm_config: {max_in_flight: 1}
`)
	for _, path := range []string{"/v1/auth", "/v1/auth/anything"} {
		resp, _ := e.get(path)
		if resp.StatusCode == 200 {
			t.Fatalf("%s admitted a request that a concurrency rule matched", path)
		}
	}
	if got := e.slotsFree("one", "global"); got != 1 {
		t.Fatalf("forward auth held a slot (%d free)", got)
	}
}
