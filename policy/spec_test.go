package policy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// One rule for what a limit may be: sluice.NewLimit's. A file accepts
// exactly the limits that code accepts, and refuses the others with
// NewLimit's reason at the line of the field it names.
func TestFileAndCodeAgreeOnLimits(t *testing.T) {
	cases := []struct {
		yaml string // algorithm_config body, one field a line
		spec sluice.Spec
	}{
		{"rps: 100\nburst: 10", sluice.Spec{TokensPerSecond: 100, Burst: 10}},
		{"rps: 100\nburst: 1e12", sluice.Spec{TokensPerSecond: 100, Burst: 1e12}},
		{"rps: 1e12\nburst: 10", sluice.Spec{TokensPerSecond: 1e12, Burst: 10}},
		{"rps: 100\nburst: 0.0000001", sluice.Spec{TokensPerSecond: 100, Burst: 1e-7}},
		{"rate: 0.0000001\nperiod: 1h", sluice.Spec{Rate: 1e-7, Period: 3600e9}},
		{"rate: 10\nperiod: 1m\ncapacity: 1e12", sluice.Spec{Rate: 10, Period: 60e9, Capacity: 1e12}},
		{"rate: 10\nperiod: 1m\ncapacity: 2", sluice.Spec{Rate: 10, Period: 60e9, Capacity: 2}},
		{"rps: 1\nburst: 1\nreserve: true\nmax_reserved: 1e12", sluice.Spec{TokensPerSecond: 1, Burst: 1, Reserve: true, MaxReserved: 1e12}},
	}
	for _, c := range cases {
		body := "      " + strings.ReplaceAll(c.yaml, "\n", "\n      ") + "\n"
		got := problems(t, rule("", body))
		c.spec.Name = "r"
		_, err := sluice.NewLimit(c.spec)
		if err == nil {
			if len(got) != 0 {
				t.Errorf("%q: NewLimit accepts it, the file does not: %v", c.yaml, got)
			}
			continue
		}
		var se *sluice.SpecError
		if !errors.As(err, &se) || se.Field == "" {
			t.Fatalf("%q: %v names no field", c.yaml, err)
		}
		line := 5
		for i, l := range strings.Split(c.yaml, "\n") {
			if strings.HasPrefix(l, se.Field+":") || (se.Field == "tokens_per_second" && strings.HasPrefix(l, "rps:")) {
				line = 5 + i
			}
		}
		field := se.Field
		if field == "tokens_per_second" {
			field = "rps"
		}
		want := fmt.Sprintf("c.yaml:%d: rules[0].algorithm_config.%s: %s", line, field, se.Reason)
		if len(got) != 1 || got[0] != want {
			t.Errorf("%q:\n got %v\nwant %s", c.yaml, got, want)
		}
	}
}
