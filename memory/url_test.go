package memory_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
)

// memory://?max_keys= bounds the store; a bad or unknown parameter is an
// error naming it.
func TestOpenURL(t *testing.T) {
	st, err := memory.Open("memory://?max_keys=16")
	if err != nil {
		t.Fatal(err)
	}
	lim := sluice.MustLimit(sluice.Spec{Name: "u", TokensPerSecond: 1, Burst: 2})
	for i := range 40 {
		conformance.Take(context.Background(), st, engine.OpTake, sluice.Request{Limit: lim, Key: string(rune('a' + i))})
	}
	if n := st.Len(); n != 16 {
		t.Fatalf("max_keys=16 holds %d keys", n)
	}
	if full, partial := st.Evictions(); full+partial != 24 {
		t.Fatalf("%d full and %d partial evictions, want 24 in all", full, partial)
	}
	if _, err := memory.Open("memory://"); err != nil {
		t.Fatalf("memory://: %v", err)
	}
	for url, want := range map[string]string{
		"memory://?max_keys=0":     `max_keys "0"`,
		"memory://?max_keys=1e6":   `max_keys "1e6"`,
		"memory://?maxkeys=100000": `unknown parameter "maxkeys"`,
		"redis://localhost:6379":   `want memory://`,
	} {
		if _, err := memory.Open(url); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error naming %s", url, err, want)
		}
	}
}
