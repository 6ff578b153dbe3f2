package metrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/quota"
)

// WatchLeases exports a quota.Store's slices and tokens held per leased
// rule.
func TestWatchLeases(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1000, 0))
	lim := sluice.MustLimit(sluice.Spec{Name: "global", TokensPerSecond: 0.001, Burst: 1000})
	q := quota.New(memory.New(memory.Options{Clock: clock}), quota.Options{Clock: clock})
	if err := q.Configure(map[*sluice.Limit]quota.Settings{lim: {MaxSlice: 20, HotAfter: 1}}); err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	m.WatchLeases(q)
	l := sluice.New(q)
	for range 5 {
		if _, err := l.Take(t.Context(), sluice.Request{Limit: lim, Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	st := q.Stats()[0]
	clock.Advance(2 * time.Second)
	if err := q.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	v := m.Values(`sluice_lease_slices_taken_total{rule="global"}`, `sluice_lease_slices_returned_total{rule="global"}`,
		`sluice_lease_slices_dropped_total{rule="global"}`, `sluice_lease_tokens_held{rule="global"}`, `sluice_lease_max_slice_tokens{rule="global"}`)
	want := map[string]float64{
		`sluice_lease_slices_taken_total{rule="global"}`:    float64(st.Taken),
		`sluice_lease_slices_returned_total{rule="global"}`: 1, // what was left at the term's end
		`sluice_lease_slices_dropped_total{rule="global"}`:  0,
		`sluice_lease_tokens_held{rule="global"}`:           0,
		`sluice_lease_max_slice_tokens{rule="global"}`:      20,
	}
	for k, w := range want {
		if v[k] != w {
			t.Errorf("%s = %v, want %v (all: %v)", k, v[k], w, v)
		}
	}
	if st.Taken < 2 || st.Held <= 0 {
		t.Errorf("before the sweep: %+v, want slices taken and tokens held", st)
	}
}
