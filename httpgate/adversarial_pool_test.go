package httpgate_test

import (
	"fmt"
	"testing"
)

// A decision's working memory is pooled (policy.Scratch, the decision
// API's read body): nothing of one request may reach the next. After a
// drained client's request, a new client, or one with no key at all, is
// judged as itself, never as the client before it, on forward auth and
// on the decision API alike.
func TestAttackPooledMemoryCarriesNothingOver(t *testing.T) {
	e := newEnv(t, `
rules:
  - name: per-user
    limit_keys: ["query:user", "header:X-Team"]
    missing_key: skip
    algorithm_config: {rps: 1, burst: 1}
`)
	auth := func(query string, hdr ...string) int {
		resp, _ := e.get("/v1/auth"+query, hdr...)
		return resp.StatusCode
	}
	if got := statuses(t, 2, func(int) int { return auth("?user=alice", "X-Team", "red") }); got != "200 429" {
		t.Fatalf("alice: %s, want 200 429", got)
	}
	for i := range 20 {
		if got := auth("?user=alice", "X-Team", "red"); got != 429 {
			t.Fatalf("round %d: drained alice %d, want 429", i, got)
		}
		if got := auth(fmt.Sprintf("?user=bob%d", i), "X-Team", "red"); got != 200 {
			t.Fatalf("round %d: a new user after alice: %d, want 200", i, got)
		}
		if got := auth("?user=alice", "X-Team", fmt.Sprintf("blue%d", i)); got != 200 {
			t.Fatalf("round %d: alice of a new team: %d, want 200", i, got)
		}
		if got := auth(""); got != 200 {
			t.Fatalf("round %d: no key after alice: %d, want 200 (skipped)", i, got)
		}
	}

	take := func(key string) string {
		resp, body := e.post("/v1/take", `{"rule":"per-user","key":"`+key+`"}`)
		return fmt.Sprint(resp.StatusCode, body["allowed"])
	}
	if got := take("carol"); got != "200 true" {
		t.Fatalf("carol's first take: %s", got)
	}
	for i := range 20 {
		if got := take("carol"); got != "200 false" {
			t.Fatalf("round %d: drained carol: %s, want 200 false", i, got)
		}
		if got := take(fmt.Sprintf("dave%d", i)); got != "200 true" {
			t.Fatalf("round %d: a new key after carol: %s, want 200 true", i, got)
		}
	}
}
