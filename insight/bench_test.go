package insight

import (
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

// BenchmarkObserveResults is the statistics' cost per decision on the
// decision path: one result per call, over one key or 10000, one in ten
// rejected, from every CPU at once.
func BenchmarkObserveResults(b *testing.B) {
	for _, n := range []int{1, 10000} {
		b.Run(strconv.Itoa(n)+"-keys", func(b *testing.B) {
			c := New(Options{})
			rs := make([]policy.Result, n)
			for i := range rs {
				rs[i] = result(ruleIP, "client-"+strconv.Itoa(i), i%10 == 0)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					c.ObserveResults(rs[i%n : i%n+1])
					i += 7
				}
			})
		})
	}
}
