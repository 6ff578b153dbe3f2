package envoyrls_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/redis"
)

// Hour windows: the Redis run starts away from their boundaries.
const quotaYAML = `domain: q
descriptors:
  - key: qa
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: qb
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: r
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: rz
    rate_limit: {unit: hour, requests_per_unit: 1}
`

func quotaPolicy(t *testing.T, m envoyrls.Modes) *policy.Policy {
	t.Helper()
	pol, err := envoyrls.ParseReferenceConfig("quota.yaml", []byte(quotaYAML))
	if err != nil {
		t.Fatal(err)
	}
	m.Apply(pol)
	return pol
}

// quotaScenario is the reference server's overall code with quota_mode
// descriptors (envoyproxy/ratelimit src/service/ratelimit.go): a quota
// descriptor over its limit is OVER_LIMIT in its status, but fails the
// call only when every quota descriptor of it is over; a descriptor that
// is not in quota mode fails it alone. An admitted call charges its other
// descriptors; a refused one charges none (sluice's all-or-nothing).
func quotaScenario(t *testing.T, h *harness) {
	t.Helper()
	// Both quota descriptors and the rate limit fit: all charged.
	expect(t, h.call(t, "q", 0, desc("qa", "1"), desc("qb", "1"), desc("r", "1")), OK, OK, 0, OK, 2, OK, 4)
	// qa is over: a quota descriptor alone over does not fail the call,
	// and the others are charged.
	expect(t, h.call(t, "q", 0, desc("qa", "1"), desc("qb", "1"), desc("r", "1")), OK, OVER, 0, OK, 1, OK, 3)
	expect(t, h.call(t, "q", 0, desc("qa", "1"), desc("qb", "1")), OK, OVER, 0, OK, 0)
	// Every quota descriptor over: the call fails, and r is not charged.
	expect(t, h.call(t, "q", 0, desc("qa", "1"), desc("qb", "1"), desc("r", "1")), OVER, OVER, 0, OVER, 0, OK, 3)
	expect(t, h.call(t, "q", 0, desc("r", "1")), OK, OK, 2)
	// A rate limit over fails the call whatever the quota descriptors say,
	// and the quota descriptor that fits is not charged.
	expect(t, h.call(t, "q", 0, desc("rz", "1")), OK, OK, 0)
	expect(t, h.call(t, "q", 0, desc("rz", "1"), desc("qb", "2")), OVER, OVER, 0, OK, 3)
	expect(t, h.call(t, "q", 0, desc("qb", "2")), OK, OK, 2)
	// Several quota descriptors over, one fits: admitted, that one charged.
	expect(t, h.call(t, "q", 0, desc("qa", "3")), OK, OK, 0)
	expect(t, h.call(t, "q", 0, desc("qa", "3"), desc("qa", "1"), desc("qb", "2"), desc("r", "2")), OK, OVER, 0, OVER, 0, OK, 1, OK, 4)
}

func TestQuotaModeMemory(t *testing.T) {
	quotaScenario(t, start(t, quotaPolicy(t, envoyrls.Modes{})))
}

func TestQuotaModeRedis(t *testing.T) {
	addr := redistest.Server(t)
	// Fresh keys, started away from an hour boundary (waitPastBoundary).
	waitPastBoundary([]int64{3600}, false)
	store, err := redis.Open(fmt.Sprintf("redis://%s/0?timeout=1m&dial_timeout=1m&write_timeout=1m&key_prefix=quota%d:", addr, time.Now().UnixNano()), redis.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	quotaScenario(t, startOn(t, quotaPolicy(t, envoyrls.Modes{}), store, nil))
}

// QUOTA_MODE makes every descriptor a quota descriptor: one with no limit
// counts as one that passes, as in the reference's overall code.
func TestGlobalQuotaMode(t *testing.T) {
	h := start(t, quotaPolicy(t, envoyrls.Modes{Quota: true}))
	expect(t, h.call(t, "q", 0, desc("rz", "1")), OK, OK, 0)
	expect(t, h.call(t, "q", 0, desc("rz", "1"), desc("r", "1")), OK, OVER, 0, OK, 4)
	expect(t, h.call(t, "q", 0, desc("rz", "1"), desc("nolimit", "x")), OK, OVER, 0, OK, 0)
	expect(t, h.call(t, "q", 0, desc("rz", "1")), OVER, OVER, 0)
}

// SHADOW_MODE answers every call OK overall; the statuses say what was
// over, and what fits is charged.
func TestGlobalShadowMode(t *testing.T) {
	h := start(t, quotaPolicy(t, envoyrls.Modes{Shadow: true}))
	expect(t, h.call(t, "q", 0, desc("rz", "1")), OK, OK, 0)
	resp := h.call(t, "q", 0, desc("rz", "1"), desc("r", "1"))
	expect(t, resp, OK, OVER, 0, OK, 4)
	if header(resp, "Retry-After") != "" {
		t.Errorf("an admitted call says Retry-After: %s", header(resp, "Retry-After"))
	}
	expect(t, h.call(t, "q", 0, desc("r", "1")), OK, OK, 3)
}
