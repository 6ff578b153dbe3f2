package httpgate_test

import (
	"testing"
)

// The live page marks a leased rule: its limit carries the lease's max
// slice (each process's part of the bound), term and hot_after.
func TestStatsMarksLeasedRules(t *testing.T) {
	e, _ := newUIEnv(t, `
admin_token_env: ADMIN
rules:
  - name: provider
    limit_keys: []
    algorithm_config: {rps: 20000, burst: 20000, lease: {}}
  - name: exact
    limit_keys: []
    algorithm_config: {rps: 10, burst: 10}
`, adminToken)
	s := getStats(t, e, "Authorization", "Bearer "+adminToken)
	if len(s.Rules) != 2 {
		t.Fatalf("rules: %+v", s.Rules)
	}
	l := s.Rules[0].Limits[0].Lease
	if l == nil || l.MaxSlice != 60 || l.TermS != 1 || l.HotAfter != 8 {
		t.Errorf("provider's lease: %+v, want max slice 60, term 1s, hot after 8", l)
	}
	if s.Rules[1].Limits[0].Lease != nil {
		t.Errorf("an exact rule is marked leased: %+v", s.Rules[1].Limits[0])
	}
}
