package insight

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// A fleet's processes share their statistics through the store they
// share: each publishes a Report of its own Snapshot, and any of them
// merges the Reports it reads into the whole fleet's (Merge). The Report
// is bounded whatever the traffic: MaxReportRules rules, the top
// MaxReportKeys keys of each ranking, and MaxReportBytes in all.

// Bounds of a Report.
const (
	// MaxReportRules is the most rules a Report carries the series of;
	// the others still count in its request totals.
	MaxReportRules = 32
	// MaxReportKeys is the most keys of each ranking a Report carries.
	MaxReportKeys = 10
	// MaxReportBytes is the most a Report takes encoded: a reader refuses
	// a longer one, and a writer drops rules' series until it fits.
	MaxReportBytes = 256 << 10
	// maxIDLen bounds a process id.
	maxIDLen = 128
	// maxReportMs is the last millisecond of the year 9999, the last a
	// time is written in JSON (RFC 3339) as: the page's answer holds a
	// Report's times, and one past it could not be written at all.
	maxReportMs = 253402300799999
)

// Report is what one process publishes to its fleet: its requests and
// its rules' decisions per second over the window that starts at From,
// and the top of its rankings.
type Report struct {
	ID   string `json:"id"`
	Host string `json:"host"`
	// At is when it was published and Started when the process started,
	// in Unix milliseconds.
	At      int64 `json:"at"`
	Started int64 `json:"started"`
	From    int64 `json:"from"`
	// Requests: [0] admitted, [1] rejected, per second.
	Requests [2][]uint64            `json:"requests"`
	Rules    map[string][5][]uint64 `json:"rules,omitempty"`
	// Truncated: rules were left out to keep within the bounds.
	Truncated  bool          `json:"truncated,omitempty"`
	ByRejected ReportRanking `json:"by_rejected"`
	ByTraffic  ReportRanking `json:"by_traffic"`
}

// ReportRanking is the top of one ranking (see Ranking).
type ReportRanking struct {
	Since int64       `json:"since"` // Unix seconds
	Total uint64      `json:"total"`
	Bound uint64      `json:"bound"`
	Keys  []ReportKey `json:"keys"`
}

// ReportKey is one hot key of a ReportRanking.
type ReportKey struct {
	Limit string `json:"l"`
	Key   string `json:"k"`
	Count uint64 `json:"c"`
	Error uint64 `json:"e"`
}

// NewReport describes s as the process id on host publishes it.
func NewReport(id, host string, s Snapshot) Report {
	r := Report{ID: id, Host: host, At: s.Now.UnixMilli(), Started: s.Started.UnixMilli(), From: s.From,
		Requests: [2][]uint64{s.Requests.Admitted, s.Requests.Rejected}, Rules: map[string][5][]uint64{}}
	for i, name := range slices.Sorted(maps.Keys(s.Rules)) {
		if i == MaxReportRules {
			r.Truncated = true
			break
		}
		rc := s.Rules[name]
		r.Rules[name] = [5][]uint64{rc.Allowed, rc.Rejected, rc.ShadowRejected, rc.StoreError, rc.NotCharged}
	}
	r.ByRejected = reportRanking(s.ByRejected)
	r.ByTraffic = reportRanking(s.ByTraffic)
	return r
}

func reportRanking(rk Ranking) ReportRanking {
	out := ReportRanking{Since: rk.Since.Unix(), Total: rk.Total, Bound: rk.Bound, Keys: []ReportKey{}}
	for i, k := range rk.Keys {
		if i == MaxReportKeys {
			break
		}
		out.Keys = append(out.Keys, ReportKey{Limit: k.Limit, Key: k.Key, Count: k.Count, Error: k.Error})
	}
	return out
}

// Encode is r in JSON, its rules' series dropped (the largest names
// last) until it fits in MaxReportBytes.
func (r Report) Encode() (string, error) {
	for {
		b, err := json.Marshal(r)
		if err != nil {
			return "", fmt.Errorf("encode the fleet report: %w", err)
		}
		if len(b) <= MaxReportBytes {
			return string(b), nil
		}
		if len(r.Rules) == 0 {
			return "", fmt.Errorf("the fleet report takes %d bytes, more than %d even without its rules", len(b), MaxReportBytes)
		}
		names := slices.Sorted(maps.Keys(r.Rules))
		rules := make(map[string][5][]uint64, len(names)/2)
		for _, name := range names[:len(names)/2] {
			rules[name] = r.Rules[name]
		}
		r.Rules, r.Truncated = rules, true
	}
}

// DecodeReport reads a Report another process published: one larger
// than MaxReportBytes, with series or rankings beyond a Report's bounds,
// or with a time (At, Started, a ranking's Since) before 1970 or past the
// year 9999, is refused (it is not one of ours to trust).
func DecodeReport(raw string) (Report, error) {
	var r Report
	if len(raw) > MaxReportBytes {
		return r, fmt.Errorf("a fleet report of %d bytes, more than %d", len(raw), MaxReportBytes)
	}
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return r, fmt.Errorf("decode a fleet report: %w", err)
	}
	if r.ID == "" || len(r.ID) > maxIDLen || len(r.Host) > maxIDLen {
		return r, errors.New("a fleet report without a valid id")
	}
	series := r.Requests[:]
	for _, rs := range r.Rules {
		series = append(series, rs[:]...)
	}
	if len(r.Rules) > MaxReportRules || len(r.ByRejected.Keys) > MaxReportKeys || len(r.ByTraffic.Keys) > MaxReportKeys ||
		slices.ContainsFunc(series, func(s []uint64) bool { return len(s) > Window }) {
		return r, errors.New("a fleet report beyond its bounds")
	}
	// Every process's page shows these times, and one that JSON cannot
	// write made the whole answer fail (TestAttackFleetReportTimeBreaksPage).
	outside := func(t, most int64) bool { return t < 0 || t > most }
	if outside(r.At, maxReportMs) || outside(r.Started, maxReportMs) ||
		outside(r.ByRejected.Since, maxReportMs/1000) || outside(r.ByTraffic.Since, maxReportMs/1000) {
		return r, errors.New("a fleet report with a time out of range")
	}
	return r, nil
}

// AddSeries adds src, whose first value is of the Unix second srcFrom,
// into dst, whose first is of dstFrom: the seconds both cover. dst nil
// with something to add becomes a Window of zeros first; the result is
// dst.
func AddSeries(dst []uint64, dstFrom int64, src []uint64, srcFrom int64) []uint64 {
	for i, v := range src {
		j := srcFrom + int64(i) - dstFrom
		if v == 0 || j < 0 || j >= Window {
			continue
		}
		if dst == nil {
			dst = make([]uint64, Window)
		}
		dst[j] += v
	}
	return dst
}

// MergeRanking merges the top keys of the rankings of several processes
// into the top n of the fleet. A key's counts add up; a process that does
// not list a key may still have counted it: at most its smallest listed
// count when it listed a full MaxReportKeys, else at most its Bound, and
// that is added to the key's Error, so that the key's fleet-wide count
// stays within Count±Error. Total and Bound add up too (Bound raised to
// the largest Error shown, which a key listed by some processes only may
// reach); Since is the earliest. A single ranking comes back as it was,
// cut to n.
func MergeRanking(rks []ReportRanking, n int) ReportRanking {
	out := ReportRanking{Keys: []ReportKey{}}
	type item struct{ l, k string }
	idx := map[item]int{}
	unlisted := make([]uint64, len(rks))
	for p, rk := range rks {
		if out.Since == 0 || (rk.Since != 0 && rk.Since < out.Since) {
			out.Since = rk.Since
		}
		out.Total += rk.Total
		out.Bound += rk.Bound
		unlisted[p] = rk.Bound
		if len(rk.Keys) >= MaxReportKeys {
			unlisted[p] = slices.MinFunc(rk.Keys, func(a, b ReportKey) int { return cmp.Compare(a.Count, b.Count) }).Count
		}
		for _, k := range rk.Keys {
			it := item{k.Limit, k.Key}
			i, ok := idx[it]
			if !ok {
				i = len(out.Keys)
				idx[it] = i
				out.Keys = append(out.Keys, ReportKey{Limit: k.Limit, Key: k.Key})
			}
			out.Keys[i].Count += k.Count
			out.Keys[i].Error += k.Error
		}
	}
	for i, k := range out.Keys {
		for p, rk := range rks {
			if !slices.ContainsFunc(rk.Keys, func(x ReportKey) bool { return x.Limit == k.Limit && x.Key == k.Key }) {
				out.Keys[i].Error += unlisted[p]
			}
		}
		// The bound holds for every key shown.
		out.Bound = max(out.Bound, out.Keys[i].Error)
	}
	slices.SortStableFunc(out.Keys, func(a, b ReportKey) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Key, b.Key))
	})
	out.Keys = out.Keys[:min(len(out.Keys), n)]
	return out
}
