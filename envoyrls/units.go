package envoyrls

import (
	"math"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
)

// units in ascending length, as the protocol can name them and the
// reference server counts them: a month is 30 days and a year 365, and
// windows are aligned to multiples of the unit since the Unix epoch.
var units = []struct {
	unit rlspb.RateLimitResponse_RateLimit_Unit
	d    time.Duration
}{
	{rlspb.RateLimitResponse_RateLimit_SECOND, time.Second},
	{rlspb.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	{rlspb.RateLimitResponse_RateLimit_HOUR, time.Hour},
	{rlspb.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	{rlspb.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	{rlspb.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
	{rlspb.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
}

// unitLength is the length of unit, 0 for one the protocol has no length
// for.
func unitLength(unit rlspb.RateLimitResponse_RateLimit_Unit) time.Duration {
	for _, u := range units {
		if u.unit == unit {
			return u.d
		}
	}
	return 0
}

// inferLimit describes a sluice limit in the protocol's terms: requests
// per unit (times a multiplier). The rule's own spelling is kept when the
// protocol can say it: 600 per minute stays 600/MINUTE rather than
// 10/SECOND, 100 per 10 minutes is 100/MINUTE x10. A period no unit
// divides (or a fractional rate) is given per the shortest unit at least
// as long as the period in which the rate is a whole number, else rounded
// per the shortest unit at least as long as the period.
func inferLimit(name string, l *sluice.Limit) *rlspb.RateLimitResponse_RateLimit {
	sp := l.Spec()
	rate, period := sp.Rate, sp.Period
	if sp.TokensPerSecond > 0 {
		rate, period = sp.TokensPerSecond, time.Second
	}
	if period <= 0 {
		period = time.Second
	}
	out := &rlspb.RateLimitResponse_RateLimit{Name: name}
	whole := rate == math.Trunc(rate)
	// A period that is a whole number of some unit: the largest such unit.
	if whole {
		for i := len(units) - 1; i >= 0; i-- {
			u := units[i]
			if period%u.d == 0 {
				out.Unit, out.RequestsPerUnit = u.unit, clampU32(int64(rate))
				if m := int64(period / u.d); m > 1 {
					out.UnitMultiplier = wrapperspb.UInt32(clampU32(m))
				}
				return out
			}
		}
	}
	per := func(u time.Duration) float64 { return rate * float64(u) / float64(period) }
	for _, u := range units {
		if u.d >= period {
			if v := per(u.d); v == math.Trunc(v) {
				out.Unit, out.RequestsPerUnit = u.unit, clampU32(int64(v))
				return out
			}
		}
	}
	for _, u := range units {
		if u.d >= period || u.unit == rlspb.RateLimitResponse_RateLimit_YEAR {
			out.Unit, out.RequestsPerUnit = u.unit, clampU32(int64(math.Round(per(u.d))))
			return out
		}
	}
	return out
}
