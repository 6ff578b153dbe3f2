package envoyrls_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/envoyrls"
)

// TestAttackUnitMultiplierOverflowShortensWindow: a limit's window is
// unit x unit_multiplier (refLimit.period), a time.Duration product that
// overflows silently. 1 per 842,578,216 weeks (some 16 million years: a
// "once ever" limit) wraps to a window of under ten minutes, and 1 per
// 1,017,872,924 years to under three: the key refills every few minutes.
// The reference server computes the window in seconds, without
// overflow. A window too long to express must be refused (or clamped),
// never wrapped to a short one.
func TestAttackUnitMultiplierOverflowShortensWindow(t *testing.T) {
	for unit, mult := range map[string]string{"week": "842578216", "year": "1017872924"} {
		cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: once, unit: " + unit + ", requests_per_unit: 1, unit_multiplier: " + mult + "}\n"
		p, err := envoyrls.ParseReferenceConfig("ref.yaml", []byte(cfg))
		if err != nil {
			continue // refused: the fix
		}
		_, lim, err := p.FindLimit("once")
		if err != nil {
			t.Fatal(err)
		}
		if got := lim.Spec().Period; got < 100*365*24*time.Hour {
			t.Errorf("1 per %s %ss is enforced as 1 per %v: the window's length overflowed", mult, unit, got)
		}
	}
}
