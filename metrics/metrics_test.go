package metrics_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
)

// byOp reads a store metric of reg: the count of each op label.
func byOp(t *testing.T, reg *prometheus.Registry, name string) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			op := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" {
					op = l.GetValue()
				}
			}
			if h := m.GetHistogram(); h != nil {
				out[op] = h.GetSampleCount()
			} else {
				out[op] = uint64(m.GetCounter().GetValue())
			}
		}
	}
	return out
}

// Refunds are store calls of their own: labelled "refund" and
// "refund_all", never counted as takes.
func TestInstrumentStoreLabelsEveryOp(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	faulty := &conformance.FaultyStore{Store: memory.New(memory.Options{})}
	lim := sluice.New(m.InstrumentStore(faulty))
	l := sluice.MustLimit(sluice.Spec{Name: "l", TokensPerSecond: 1, Burst: 5})
	ctx := context.Background()
	req := sluice.Request{Limit: l, Key: "k", Cost: 2}

	if _, err := lim.Take(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Peek(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Refund(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, _, err := lim.TakeAll(ctx, req, req); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.RefundAll(ctx, req, req); err != nil {
		t.Fatal(err)
	}
	if err := lim.Reset(ctx, l, "k"); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"take": 1, "peek": 1, "refund": 1, "take_all": 1, "refund_all": 1, "reset": 1}
	got := byOp(t, reg, "sluice_store_latency_seconds")
	for op, n := range want {
		if got[op] != n {
			t.Errorf("latency samples of op %q: %d, want %d (all: %v)", op, got[op], n, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("ops %v, want exactly %v", got, want)
	}

	// A failed refund counts as a refund's failure.
	faulty.Down.Store(true)
	if _, err := lim.Refund(ctx, req); err == nil {
		t.Fatal("the store is down, yet the refund succeeded")
	}
	if _, err := lim.RefundAll(ctx, req); err == nil {
		t.Fatal("the store is down, yet the refunds succeeded")
	}
	errs := byOp(t, reg, "sluice_store_errors_total")
	for op, n := range errs {
		if want := map[string]uint64{"refund": 1, "refund_all": 1}[op]; n != want {
			t.Errorf("store errors by op: %v, want one refund and one refund_all", errs)
		}
	}
}

// The counters alerts watch are exported at zero before anything
// happened, so that the first failure is an increase: every op's store
// errors and both reload results.
func TestAlertedCountersStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics.New(reg)
	errs := byOp(t, reg, "sluice_store_errors_total")
	if len(errs) != 11 {
		t.Errorf("store errors exported for %v, want all 11 ops", errs)
	}
	for _, op := range metrics.StoreOps() {
		if n, ok := errs[op]; !ok || n != 0 {
			t.Errorf("store errors of %s: %d (exported: %v), want 0", op, n, ok)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() == "sluice_config_reloads_total" {
			for _, m := range mf.GetMetric() {
				results[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue() == 0
			}
		}
	}
	if !results["success"] || !results["failure"] || len(results) != 2 {
		t.Errorf("reloads at zero: %v, want success and failure", results)
	}
}

func TestOpString(t *testing.T) {
	for op, want := range map[engine.Op]string{engine.OpTake: "take", engine.OpPeek: "peek", engine.OpRefund: "refund"} {
		if op.String() != want {
			t.Errorf("%d: %q, want %q", op, op.String(), want)
		}
	}
}

// TestValuesAndOnStoreCall reads metrics by name (summed, or one labelled
// series) and tells the hook every store call.
func TestValuesAndOnStoreCall(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	var calls []string
	m.OnStoreCall(func(op string, d time.Duration, failed bool) {
		calls = append(calls, fmt.Sprint(op, " ", failed, " ", d >= 0))
	})
	lim := sluice.New(m.InstrumentStore(memory.New(memory.Options{})))
	l := sluice.MustLimit(sluice.Spec{Name: "l", TokensPerSecond: 1, Burst: 1})
	if _, err := lim.Take(context.Background(), sluice.Request{Limit: l, Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(calls) != "[take false true]" {
		t.Errorf("calls: %v", calls)
	}
	m.Observe("a", metrics.ResultAllowed)
	m.Observe("a", metrics.ResultRejected)
	m.Observe("b", metrics.ResultRejected)
	got := m.Values("sluice_decisions_total", `sluice_decisions_total{result="rejected",rule="a"}`, `sluice_decisions_total{rule="b"}`, "sluice_store_latency_seconds", "sluice_no_such_metric")
	want := map[string]float64{"sluice_decisions_total": 3, `sluice_decisions_total{result="rejected",rule="a"}`: 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("values %v, want %v", got, want)
	}
}
