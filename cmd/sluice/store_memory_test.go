package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
)

// The memory store's URL is its own (memory.Open, tested there); serve
// registers its eviction counters by state.
func TestMemoryStoreURL(t *testing.T) {
	reg := prometheus.NewRegistry()
	st, closeStore, err := openStore(context.Background(), "memory://?max_keys=16", reg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	lim := sluice.MustLimit(sluice.Spec{Name: "u", TokensPerSecond: 1, Burst: 2})
	for i := range 40 {
		conformance.Take(context.Background(), st, engine.OpTake, sluice.Request{Limit: lim, Key: string(rune('a' + i))})
	}
	if n := st.(*memory.Store).Len(); n != 16 {
		t.Fatalf("max_keys=16 holds %d keys", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "sluice_memory_evictions_total" {
			for _, m := range mf.GetMetric() {
				states[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if len(states) != 2 || states["full"]+states["partial"] != 24 {
		t.Fatalf("sluice_memory_evictions_total: %v, want 24 evictions in all", states)
	}
}

// sluice check refuses what serve would: a misspelt memory parameter.
func TestCheckMemoryStoreURL(t *testing.T) {
	file := filepath.Join(t.TempDir(), "store.yaml")
	cfg := "store: {url: \"memory://?maxkeys=100\"}\nrules:\n  - name: a\n    algorithm_config: {rps: 1, burst: 1}\n"
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb strings.Builder
	if code := run([]string{"check", file}, &out, &errb); code != 1 || !strings.Contains(errb.String(), `store.url: memory store url "memory://?maxkeys=100": unknown parameter "maxkeys"`) {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}
