// Package duration reads durations as operators write them for ages and
// retention periods: Go's durations, with days and weeks ahead of the
// hours.
package duration

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Parse reads a Go duration that may also count days (d, 24h) and weeks
// (w, 7d) ahead of its hours: "1d", "2w", "1w3d", "1d12h", "1.5d", "90m".
func Parse(s string) (time.Duration, error) {
	bad := fmt.Errorf("%q is not a duration: write 90m, 36h, 1d or 2w", s)
	var total time.Duration
	rest := s
	for _, u := range []struct {
		suffix string
		d      time.Duration
	}{{"w", 7 * 24 * time.Hour}, {"d", 24 * time.Hour}} {
		i := 0
		for i < len(rest) && (rest[i] >= '0' && rest[i] <= '9' || rest[i] == '.') {
			i++
		}
		if i == 0 || i == len(rest) || !strings.HasPrefix(rest[i:], u.suffix) {
			continue
		}
		n, err := strconv.ParseFloat(rest[:i], 64)
		if err != nil || n*float64(u.d) > math.MaxInt64/2 {
			return 0, bad
		}
		total += time.Duration(n * float64(u.d))
		rest = rest[i+len(u.suffix):]
	}
	if rest == "" {
		if total == 0 && s == "" {
			return 0, bad
		}
		return total, nil
	}
	d, err := time.ParseDuration(rest)
	if err != nil || total > math.MaxInt64/2-max(d, 0) {
		return 0, bad
	}
	return total + d, nil
}
