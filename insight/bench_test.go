package insight

import (
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

// BenchmarkObserveResults is the statistics' cost per decision on the
// decision path: one result per call, over one key or 10000 (a new key
// for nearly every decision, the rankings' costliest case), one in ten
// rejected, from every CPU at once.
func BenchmarkObserveResults(b *testing.B) {
	for _, n := range []int{1, 10000} {
		b.Run(strconv.Itoa(n)+"-keys", func(b *testing.B) {
			c := New(Options{})
			keys := make([]string, n)
			for i := range keys {
				keys[i] = "client-" + strconv.Itoa(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// As on the decision path, the result is fresh in the
				// cache; only its key changes.
				rs := []policy.Result{result(ruleIP, "", false)}
				i := 0
				for pb.Next() {
					rs[0].Match.Request.Key = keys[i%n]
					rs[0].Violated = i%10 == 0
					c.ObserveResults(rs)
					i += 7
				}
			})
		})
	}
}
