package envoyrls_test

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/redis"
)

// These tests pin what the reference server (envoyproxy/ratelimit) answers
// for its own example configurations, field for field: code,
// current_limit, limit_remaining and duration_until_reset of every
// descriptor, and the overall code. They are the answers of the
// reference run with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true, whose
// calls charge nothing when one of their descriptors is over its limit,
// as sluice's do. The reference sends no response headers unless asked
// to; sluice's RateLimit headers are checked to say what the statuses say.

const (
	sec  = rlspb.RateLimitResponse_RateLimit_SECOND
	min_ = rlspb.RateLimitResponse_RateLimit_MINUTE
	hour = rlspb.RateLimitResponse_RateLimit_HOUR
	day  = rlspb.RateLimitResponse_RateLimit_DAY
)

// unitSecs is a unit's length as the reference server counts it.
var unitSecs = map[rlspb.RateLimitResponse_RateLimit_Unit]int64{
	sec: 1, min_: 60, hour: 3600, day: 86400,
	rlspb.RateLimitResponse_RateLimit_WEEK:  7 * 86400,
	rlspb.RateLimitResponse_RateLimit_MONTH: 30 * 86400,
	rlspb.RateLimitResponse_RateLimit_YEAR:  365 * 86400,
}

// refReset is the reference server's duration_until_reset (its
// utils.CalculateReset): the unit (times the multiplier) in seconds, less
// the Unix time in whole seconds modulo it.
func refReset(unit rlspb.RateLimitResponse_RateLimit_Unit, mult uint32, now time.Time) time.Duration {
	p := unitSecs[unit] * int64(max(mult, 1))
	return time.Duration(p-now.Unix()%p) * time.Second
}

// st is one descriptor's expected status.
type st struct {
	code      rlspb.RateLimitResponse_Code
	rpu       uint32 // with unit: the expected current_limit
	unit      rlspb.RateLimitResponse_RateLimit_Unit
	name      string
	remaining uint32
	shadow    bool // a shadow-mode limit: in the status, not in the headers
}

func (w st) limit() *rlspb.RateLimitResponse_RateLimit {
	if w.unit == rlspb.RateLimitResponse_RateLimit_UNKNOWN {
		return nil
	}
	return &rlspb.RateLimitResponse_RateLimit{Name: w.name, RequestsPerUnit: w.rpu, Unit: w.unit}
}

// Shorthands for the common statuses.
func ok(rpu uint32, unit rlspb.RateLimitResponse_RateLimit_Unit, remaining uint32) st {
	return st{code: OK, rpu: rpu, unit: unit, remaining: remaining}
}
func over(rpu uint32, unit rlspb.RateLimitResponse_RateLimit_Unit) st {
	return st{code: OVER, rpu: rpu, unit: unit}
}
func named(s st, name string) st { s.name = name; return s }
func shadowed(s st) st           { s.shadow = true; return s }

var (
	noLimit   = st{code: OK}                        // no limit applies
	unlimited = st{code: OK, remaining: ^uint32(0)} // unlimited: true
	overall   = map[bool]rlspb.RateLimitResponse_Code{true: OK, false: OVER}
)

// call is one ShouldRateLimit and its expected answer.
type call struct {
	domain string
	hits   uint32
	descs  [][]string // key, value, key, value...
	want   []st
}

func (c call) allowed() bool {
	for _, w := range c.want {
		if w.code == OVER {
			return false
		}
	}
	return true
}

// scenario is a sequence of calls inside one window of every unit they
// use, on fresh buckets.
type scenario struct {
	name  string
	file  string
	calls []call
}

var fidelity = []scenario{
	{"basic: one limit per value, SECOND", "testdata/reference-integration.yaml", []call{
		{"basic", 0, [][]string{{"key1", "foo"}}, []st{ok(50, sec, 49)}},
		{"basic", 49, [][]string{{"key1", "foo"}}, []st{ok(50, sec, 0)}},
		{"basic", 0, [][]string{{"key1", "foo"}}, []st{over(50, sec)}},
		{"basic", 0, [][]string{{"key1", "bar"}}, []st{ok(50, sec, 49)}},
		{"basic", 0, [][]string{{"key1_local", "foo"}}, []st{ok(50, sec, 49)}},
	}},
	{"basic: SECOND and MINUTE in one call", "testdata/reference-integration.yaml", []call{
		{"basic", 0, [][]string{{"one_per_minute", "foo"}}, []st{ok(1, min_, 0)}},
		{"basic", 0, [][]string{{"one_per_minute", "foo"}}, []st{over(1, min_)}},
		// Over the limit: the other descriptor is not charged.
		{"basic", 0, [][]string{{"key1", "foo"}, {"one_per_minute", "foo"}}, []st{ok(50, sec, 50), over(1, min_)}},
		{"basic", 0, [][]string{{"key1", "foo"}}, []st{ok(50, sec, 49)}},
	}},
	{"another: MINUTE, HOUR and DAY in one call", "testdata/reference-integration.yaml", []call{
		{"another", 0, [][]string{{"key2", "a"}, {"key3", "a"}, {"key4", "a"}}, []st{ok(20, min_, 19), ok(10, hour, 9), ok(20, day, 19)}},
		{"another", 10, [][]string{{"key2", "a"}, {"key3", "a"}, {"key4", "a"}}, []st{ok(20, min_, 19), over(10, hour), ok(20, day, 19)}},
		{"another", 9, [][]string{{"key2", "a"}, {"key4", "a"}}, []st{ok(20, min_, 10), ok(20, day, 10)}},
		{"another", 0, [][]string{{"key2_local", "a"}, {"key3_local", "a"}, {"key4_local", "a"}}, []st{ok(20, min_, 19), ok(10, hour, 9), ok(20, day, 19)}},
	}},
	{"unknown domain", "testdata/reference-integration.yaml", []call{
		{"unknown", 0, [][]string{{"key1", "foo"}}, []st{noLimit}},
		{"basic", 0, [][]string{{"key9", "foo"}, {"key1", "foo"}}, []st{noLimit, ok(50, sec, 49)}},
	}},
	{"share_threshold: one bucket for every matching value", "testdata/reference-integration.yaml", []call{
		{"share-threshold-test", 0, [][]string{{"files", "files/a"}}, []st{ok(10, hour, 9)}},
		{"share-threshold-test", 0, [][]string{{"files", "files/b"}}, []st{ok(10, hour, 8)}},
		{"share-threshold-test", 8, [][]string{{"files", "files/c"}}, []st{ok(10, hour, 0)}},
		{"share-threshold-test", 0, [][]string{{"files", "files/d"}}, []st{over(10, hour)}},
		// Without share_threshold, each matching value on its own.
		{"share-threshold-test", 0, [][]string{{"files_no_share", "files_no_share/a"}, {"files_no_share", "files_no_share/b"}}, []st{ok(10, hour, 9), ok(10, hour, 9)}},
		{"share-threshold-test", 0, [][]string{{"files_no_share", "files_no_share/a"}}, []st{ok(10, hour, 8)}},
	}},
	{"example: nested, blocked, unlimited, shadow", "testdata/reference-example.yaml", []call{
		{"rl", 0, [][]string{{"source_cluster", "proxy", "destination_cluster", "mock"}}, []st{ok(1, min_, 0)}},
		{"rl", 0, [][]string{{"source_cluster", "proxy", "destination_cluster", "mock"}}, []st{over(1, min_)}},
		{"rl", 0, [][]string{{"source_cluster", "proxy"}}, []st{noLimit}},
		{"rl", 0, [][]string{{"foo", "x"}}, []st{ok(2, min_, 1)}},
		{"rl", 0, [][]string{{"foo", "x", "bar", "y"}}, []st{ok(3, min_, 2)}},
		{"rl", 0, [][]string{{"foo", "x", "bar", "banned"}}, []st{over(0, min_)}},
		{"rl", 0, [][]string{{"foo", "x", "bay", "z"}}, []st{unlimited}},
		{"rl", 0, [][]string{{"qux", "anything"}}, []st{unlimited}},
		{"rl", 0, [][]string{{"foo", "x", "baz", "shady"}}, []st{shadowed(ok(1, min_, 0))}},
		{"rl", 0, [][]string{{"foo", "x", "baz", "shady"}}, []st{shadowed(ok(1, min_, 0))}},
	}},
	{"example: SECOND and MINUTE in one call", "testdata/reference-example.yaml", []call{
		{"rl", 0, [][]string{{"foo", "m"}, {"foo", "m", "baz", "m"}}, []st{ok(2, min_, 1), ok(1, sec, 0)}},
		{"rl", 0, [][]string{{"foo", "m"}, {"foo", "m", "baz", "m"}}, []st{ok(2, min_, 1), over(1, sec)}},
		{"rl", 0, [][]string{{"foo", "m"}, {"foo", "m", "bar", "banned"}}, []st{ok(2, min_, 1), over(0, min_)}},
		{"rl", 0, [][]string{{"foo", "m"}, {"foo", "m", "baz", "shady"}}, []st{ok(2, min_, 0), shadowed(ok(1, min_, 0))}},
	}},
	{"shipped example: SECOND, MINUTE and HOUR in one call", "../examples/ratelimit-config.yaml", []call{
		{"edge", 0, [][]string{{"remote_address", "198.51.100.7"}, {"path", "/api/search", "client_id", "c1"}, {"tenant", "t1"}},
			[]st{named(ok(600, min_, 599), "per-address"), named(ok(10, sec, 9), "search-per-client"), shadowed(named(ok(10000, hour, 9999), "tenant-trial"))}},
		{"edge", 9, [][]string{{"path", "/api/search", "client_id", "c1"}}, []st{named(ok(10, sec, 0), "search-per-client")}},
		{"edge", 0, [][]string{{"remote_address", "198.51.100.7"}, {"path", "/api/search", "client_id", "c1"}},
			[]st{named(ok(600, min_, 599), "per-address"), named(over(10, sec), "search-per-client")}},
		{"edge", 0, [][]string{{"path", "/api/search", "client_id", "batch-importer"}}, []st{ok(100, sec, 99)}},
	}},
	{"shipped example: replaces, wildcard, unlimited, blocked", "../examples/ratelimit-config.yaml", []call{
		{"edge", 0, [][]string{{"remote_address", "198.51.100.8"}, {"plan", "free"}}, []st{noLimit, named(ok(1000, day, 999), "free-plan")}},
		{"edge", 0, [][]string{{"remote_address", "198.51.100.8"}}, []st{named(ok(600, min_, 599), "per-address")}},
		{"edge", 0, [][]string{{"user_agent", "bot-a"}}, []st{named(ok(60, min_, 59), "bots")}},
		{"edge", 0, [][]string{{"user_agent", "bot-b"}}, []st{named(ok(60, min_, 58), "bots")}},
		{"edge", 0, [][]string{{"user_agent", "health-checker"}}, []st{unlimited}},
		{"edge", 0, [][]string{{"remote_address", "192.0.2.66"}, {"user_agent", "bot-c"}}, []st{over(0, sec), named(ok(60, min_, 58), "bots")}},
	}},
}

// answer is a call's response and the times around it.
type answer struct {
	resp          *rlspb.RateLimitResponse
	before, after time.Time
}

func loadRef(t *testing.T, file string) *policy.Policy {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := envoyrls.ParseReferenceConfig(file, data)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func (sc scenario) run(t *testing.T, h *harness, now func() time.Time) []answer {
	t.Helper()
	out := make([]answer, len(sc.calls))
	for i, c := range sc.calls {
		ds := make([]*rlv3.RateLimitDescriptor, len(c.descs))
		for j, kv := range c.descs {
			ds[j] = desc(kv...)
		}
		out[i].before = now()
		out[i].resp = h.call(t, c.domain, c.hits, ds...)
		out[i].after = now()
	}
	return out
}

// periods are the window lengths, in seconds, the scenario's limits use.
func (sc scenario) periods() []int64 {
	seen := map[int64]bool{}
	var out []int64
	for _, c := range sc.calls {
		for _, w := range c.want {
			if p := unitSecs[w.unit]; p > 0 && !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

var tParam = regexp.MustCompile(`;t=(\d+)`)

// check compares the answers with the scenario, field for field.
func (sc scenario) check(t *testing.T, as []answer) {
	t.Helper()
	for i, c := range sc.calls {
		a := as[i]
		where := fmt.Sprintf("call %d (%s %v)", i, c.domain, c.descs)
		if a.resp.OverallCode != overall[c.allowed()] {
			t.Errorf("%s: overall_code %v, want %v", where, a.resp.OverallCode, overall[c.allowed()])
		}
		// The trio describes the enforce-mode limit closest to rejecting:
		// a rejecting one (the longest wait), else the fewest remaining.
		hdr, bucket := -1, false
		resets := map[int64]bool{}
		for j, w := range c.want {
			got := a.resp.Statuses[j]
			if got.Code != w.code || got.LimitRemaining != w.remaining || !proto.Equal(got.CurrentLimit, w.limit()) {
				t.Errorf("%s: status %d: %v remaining %d limit %v, want %v remaining %d limit %v", where, j, got.Code, got.LimitRemaining, got.CurrentLimit, w.code, w.remaining, w.limit())
			}
			if w.limit() == nil {
				if got.DurationUntilReset != nil {
					t.Errorf("%s: status %d: duration_until_reset %v without a limit", where, j, got.DurationUntilReset.AsDuration())
				}
				continue
			}
			// The reference reads the clock once per call; the call ran
			// between before and after, inside one window.
			d := got.DurationUntilReset.AsDuration()
			lo, hi := refReset(w.unit, 1, a.after), refReset(w.unit, 1, a.before)
			if d < lo || d > hi {
				t.Errorf("%s: status %d: duration_until_reset %v, want %v (the reference's whole seconds)", where, j, d, hi)
			}
			if w.shadow {
				continue
			}
			bucket = bucket || w.rpu > 0
			resets[int64(d/time.Second)] = true
			if hdr < 0 {
				hdr = j
				continue
			}
			b := a.resp.Statuses[hdr]
			if c.allowed() && got.LimitRemaining < b.LimitRemaining ||
				!c.allowed() && got.Code == OVER && (b.Code != OVER || got.DurationUntilReset.AsDuration() > b.DurationUntilReset.AsDuration()) {
				hdr = j
			}
		}
		var reset int64
		if hdr >= 0 {
			reset = int64(a.resp.Statuses[hdr].DurationUntilReset.AsDuration() / time.Second)
		}
		if ra, _ := strconv.ParseInt(header(a.resp, "Retry-After"), 10, 64); !c.allowed() && (ra < reset || ra > reset+reset/2) {
			t.Errorf("%s: Retry-After %d, want %d plus at most half of it", where, ra, reset)
		}
		if hdr < 0 || !bucket {
			// A limit of 0 requests has no bucket: alone, it brings
			// Retry-After but no RateLimit fields.
			if header(a.resp, "RateLimit-Limit") != "" || header(a.resp, "RateLimit") != "" {
				t.Errorf("%s: RateLimit headers without an enforce-mode limit: %v", where, a.resp.ResponseHeadersToAdd)
			}
			continue
		}
		b := a.resp.Statuses[hdr]
		if header(a.resp, "RateLimit-Limit") != strconv.Itoa(int(b.CurrentLimit.RequestsPerUnit)) ||
			header(a.resp, "RateLimit-Remaining") != strconv.Itoa(int(b.LimitRemaining)) ||
			header(a.resp, "RateLimit-Reset") != strconv.FormatInt(reset, 10) {
			t.Errorf("%s: trio %s/%s/%s, want %d/%d/%d (status %d)", where, header(a.resp, "RateLimit-Limit"), header(a.resp, "RateLimit-Remaining"),
				header(a.resp, "RateLimit-Reset"), b.CurrentLimit.RequestsPerUnit, b.LimitRemaining, reset, hdr)
		}
		for _, m := range tParam.FindAllStringSubmatch(header(a.resp, "RateLimit"), -1) {
			if v, _ := strconv.ParseInt(m[1], 10, 64); !resets[v] {
				t.Errorf("%s: RateLimit %q: t=%d is no status's duration_until_reset", where, header(a.resp, "RateLimit"), v)
			}
		}
	}
}

// TestReferenceFidelityMemory runs the scenarios on the memory store at
// a fixed instant well inside every window (a manual clock).
func TestReferenceFidelityMemory(t *testing.T) {
	at := t0.Add(time.Hour + 23*time.Minute + 17*time.Second + 250*time.Millisecond)
	for _, sc := range fidelity {
		t.Run(sc.name, func(t *testing.T) {
			clock := sluice.NewManualClock(at)
			h := startOn(t, loadRef(t, sc.file), memory.New(memory.Options{Clock: clock}), clock)
			sc.check(t, sc.run(t, h, clock.Now))
		})
	}
}

// TestReferenceFidelityRedis runs them on a real redis-server, whose
// clock counts the windows. A scenario that ran across a boundary of a
// window it uses is run again on fresh keys, after the boundary.
func TestReferenceFidelityRedis(t *testing.T) {
	addr := redistest.Server(t)
	for _, sc := range fidelity {
		t.Run(sc.name, func(t *testing.T) {
			pol := loadRef(t, sc.file)
			periods := sc.periods()
			// An attempt that ran across a boundary is repeated from the
			// start of a window, whose whole length it then has: only a
			// machine too loaded to run a scenario in a second runs out
			// of attempts.
			for attempt := 0; ; attempt++ {
				if attempt == 20 {
					t.Fatal("every attempt ran across a window boundary")
				}
				waitPastBoundary(periods, attempt > 0)
				// A generous per-call timeout (and the harness's store
				// deadline): a store error would be answered by
				// on_store_error, not by the window under test.
				store, err := redis.Open(fmt.Sprintf("redis://%s/0?timeout=1m&dial_timeout=1m&write_timeout=1m&key_prefix=fidelity%d:", addr, time.Now().UnixNano()), redis.Options{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { store.Close() })
				h := startOn(t, pol, store, nil)
				as := sc.run(t, h, time.Now)
				if strings.Contains(h.logs.String(), "store error") {
					t.Fatalf("the store failed:\n%s", h.logs.String())
				}
				if sameWindows(periods, as[0].before, as[len(as)-1].after) {
					sc.check(t, as)
					return
				}
			}
		})
	}
}

// waitPastBoundary sleeps past the next window boundary when it is close:
// for a scenario with SECOND limits, the next second when less than half
// of the current one is left; for longer units, the next minute when
// less than 5s of it are left (hour and day boundaries are minute
// boundaries). With fresh, a scenario with SECOND limits starts at the
// start of a second. It waits for the clock's boundaries, never for
// tokens.
func waitPastBoundary(periods []int64, fresh bool) {
	for {
		now := time.Now()
		var wait time.Duration
		for _, p := range periods {
			unit, margin := time.Minute, 5*time.Second
			if p == 1 {
				unit, margin = time.Second, 500*time.Millisecond
				if fresh {
					margin = 950 * time.Millisecond
				}
			}
			if left := unit - now.Sub(now.Truncate(unit)); left < margin {
				wait = max(wait, left)
			}
		}
		if wait == 0 {
			return
		}
		time.Sleep(wait + 5*time.Millisecond)
		fresh = false // a sleep that overran on a loaded machine still left most of the second
	}
}

// sameWindows reports whether a and b fall in the same window of every
// period (in seconds, aligned to the epoch).
func sameWindows(periods []int64, a, b time.Time) bool {
	for _, p := range periods {
		if a.Unix()/p != b.Unix()/p {
			return false
		}
	}
	return true
}

// duration_until_reset is the reference's whole seconds for every unit and
// multiplier, at a boundary, just after it, just before the next and in
// between; the RateLimit-Reset header says the same.
func TestDurationUntilResetWholeSeconds(t *testing.T) {
	const cfg = `domain: units
descriptors:
  - {key: second, rate_limit: {unit: second, requests_per_unit: 5}}
  - {key: minute, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: hour, rate_limit: {unit: hour, requests_per_unit: 5}}
  - {key: day, rate_limit: {unit: day, requests_per_unit: 5}}
  - {key: week, rate_limit: {unit: week, requests_per_unit: 5}}
  - {key: month, rate_limit: {unit: month, requests_per_unit: 5}}
  - {key: year, rate_limit: {unit: year, requests_per_unit: 5}}
  - {key: ten_seconds, rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 5}}
  - {key: five_minutes, rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 5}}
`
	pol, err := envoyrls.ParseReferenceConfig("units.yaml", []byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	limits := []struct {
		key  string
		unit rlspb.RateLimitResponse_RateLimit_Unit
		mult uint32
	}{
		{"second", sec, 1}, {"minute", min_, 1}, {"hour", hour, 1}, {"day", day, 1},
		{"week", rlspb.RateLimitResponse_RateLimit_WEEK, 1}, {"month", rlspb.RateLimitResponse_RateLimit_MONTH, 1},
		{"year", rlspb.RateLimitResponse_RateLimit_YEAR, 1}, {"ten_seconds", sec, 10}, {"five_minutes", min_, 5},
	}
	year := time.Duration(365*86400) * time.Second
	base := time.Unix(15330*86400, 0) // 2011-12-21: 15330 days is a whole number of weeks, months of 30 days and years of 365
	for n, at := range []time.Time{
		base, base.Add(time.Microsecond), base.Add(999 * time.Millisecond), base.Add(time.Second),
		base.Add(59*time.Second + 999999*time.Microsecond), base.Add(37*time.Hour + 12*time.Minute + 7*time.Second + 871292*time.Microsecond),
		t0.Add(-time.Microsecond), base.Add(year - time.Microsecond),
	} {
		h.clock.Set(at)
		for i, l := range limits {
			resp := h.call(t, "units", 0, desc(l.key, fmt.Sprint(n, "-", i)))
			got := resp.Statuses[0].DurationUntilReset.AsDuration()
			want := refReset(l.unit, l.mult, at)
			if got != want || got < time.Second || got%time.Second != 0 {
				t.Errorf("%s at %s: duration_until_reset %v, want %v", l.key, at.UTC().Format(time.RFC3339Nano), got, want)
			}
			if r := header(resp, "RateLimit-Reset"); r != strconv.FormatInt(int64(want/time.Second), 10) {
				t.Errorf("%s at %s: RateLimit-Reset %s, want %d", l.key, at.UTC().Format(time.RFC3339Nano), r, want/time.Second)
			}
		}
	}
}

// A token bucket's reset is the time until it is full again, rounded up
// to a whole second: at least 1 while it is not full, 0 when it is.
func TestDurationUntilResetTokenBucket(t *testing.T) {
	pol, err := policy.Parse("tb.yaml", []byte("rules:\n  - name: tb\n    match: {domain: d}\n    limit_keys: [\"descriptor:k\"]\n    algorithm_config: {rps: 1, burst: 5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, pol)
	check := func(resp *rlspb.RateLimitResponse, want time.Duration) {
		t.Helper()
		if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != want {
			t.Errorf("duration_until_reset %v, want %v", got, want)
		}
		if r := header(resp, "RateLimit-Reset"); r != strconv.FormatInt(int64(want/time.Second), 10) {
			t.Errorf("RateLimit-Reset %s, want %d", r, want/time.Second)
		}
	}
	check(h.call(t, "d", 0, hits(desc("k", "a"), 0)), 0) // full
	check(h.call(t, "d", 3, desc("k", "a")), 3*time.Second)
	h.clock.Advance(700 * time.Millisecond) // full in 2.3s
	check(h.call(t, "d", 0, hits(desc("k", "a"), 0)), 3*time.Second)
	h.clock.Advance(2299 * time.Millisecond) // full in 1ms
	check(h.call(t, "d", 0, hits(desc("k", "a"), 0)), time.Second)
	h.clock.Advance(time.Millisecond)
	check(h.call(t, "d", 0, hits(desc("k", "a"), 0)), 0)
}
