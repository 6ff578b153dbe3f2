package insight

import (
	"fmt"
	"strings"
	"testing"
)

// TestMergeRankingBounds: three processes' top lists merged. A key's
// counts add up, and a process that did not list it adds, to its error,
// what it may have counted unlisted: its smallest listed count when its
// list is full, else its bound; every error shown is within the bound.
func TestMergeRankingBounds(t *testing.T) {
	full := ReportRanking{Since: 100, Total: 1000, Bound: 3}
	for i := range MaxReportKeys {
		full.Keys = append(full.Keys, ReportKey{Limit: "l", Key: fmt.Sprint("f", i), Count: uint64(100 - i), Error: 1})
	}
	short := ReportRanking{Since: 90, Total: 50, Bound: 2, Keys: []ReportKey{{Limit: "l", Key: "f0", Count: 30}, {Limit: "l", Key: "s", Count: 20}}}
	empty := ReportRanking{Since: 110, Keys: []ReportKey{}}
	m := MergeRanking([]ReportRanking{full, short, empty}, 10)
	if m.Total != 1050 || m.Since != 90 || len(m.Keys) != 10 {
		t.Fatalf("merged: %+v", m)
	}
	if k := m.Keys[0]; k.Key != "f0" || k.Count != 130 || k.Error != 1 {
		t.Errorf("f0, listed by two: %+v", k)
	}
	// s: unlisted by the full list (its smallest, 91) and by the empty one
	// (its bound, 0).
	for _, k := range m.Keys {
		if k.Key == "s" && k.Error != 91 {
			t.Errorf("s: %+v, want error 91", k)
		}
		if k.Key == "f1" && k.Error != 1+2 {
			t.Errorf("f1: %+v, want error 3 (its own 1, and the short list's bound 2)", k)
		}
		if k.Error > m.Bound {
			t.Errorf("%s: error %d above the bound %d", k.Key, k.Error, m.Bound)
		}
	}
	one := MergeRanking([]ReportRanking{short}, 10)
	if one.Bound != 2 || one.Keys[0].Error != 0 || one.Keys[1].Error != 0 {
		t.Errorf("one ranking changed: %+v", one)
	}
}

// TestReportBounds: a report too large drops rules' series to fit, and
// one read beyond a report's bounds, or with a time out of range, is
// refused; one at the last millisecond of the year 9999 is read.
func TestReportBounds(t *testing.T) {
	big := make([]uint64, Window)
	for i := range big {
		big[i] = 1 << 60
	}
	r := Report{ID: "h-1", Rules: map[string][5][]uint64{}}
	for i := range MaxReportRules {
		r.Rules[fmt.Sprint("rule-", i)] = [5][]uint64{big, big, big, big, big}
	}
	raw, err := r.Encode()
	if err != nil || len(raw) > MaxReportBytes || !strings.Contains(raw, `"truncated":true`) {
		t.Fatalf("encoded %d bytes, %v", len(raw), err)
	}
	got, err := DecodeReport(raw)
	if err != nil || len(got.Rules) == 0 || len(got.Rules) >= MaxReportRules {
		t.Errorf("decoded %d rules: %v", len(got.Rules), err)
	}
	for name, bad := range map[string]string{
		"no id":     `{"id":""}`,
		"too large": `{"id":"x","host":"` + strings.Repeat("a", MaxReportBytes) + `"}`,
		"long":      `{"id":"x","requests":[[` + strings.TrimSuffix(strings.Repeat("1,", Window+1), ",") + `],[]]}`,
		"not json":  `<x>`,
		// Times before 1970 or past the year 9999.
		"at":           `{"id":"x","at":253402300800000}`,
		"started":      `{"id":"x","started":-1}`,
		"since":        `{"id":"x","by_rejected":{"since":253402300800}}`,
		"since before": `{"id":"x","by_traffic":{"since":-9223372036854775808}}`,
	} {
		if _, err := DecodeReport(bad); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := DecodeReport(`{"id":"x","at":253402300799999,"started":0,"by_traffic":{"since":253402300799}}`); err != nil {
		t.Errorf("the last times: %v", err)
	}
}

// TestReportSeriesAligned: a report's series, a second behind, add into
// the page's window at their own seconds.
func TestReportSeriesAligned(t *testing.T) {
	src := make([]uint64, Window)
	src[Window-1], src[0] = 5, 7 // its last second, and one before the page's window
	dst := AddSeries(nil, 1001, src, 1000)
	if len(dst) != Window || dst[Window-2] != 5 || dst[Window-1] != 0 {
		t.Errorf("added at %v", dst[Window-3:])
	}
	var sum uint64
	for _, v := range dst {
		sum += v
	}
	if sum != 5 {
		t.Errorf("the second before the window was added: %d", sum)
	}
	if AddSeries(nil, 0, make([]uint64, Window), 0) != nil {
		t.Error("zeros made a series")
	}
}
