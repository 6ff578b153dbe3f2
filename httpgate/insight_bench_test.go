package httpgate_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
)

// BenchmarkMiddlewareObserved is BenchmarkMiddleware's 10000 clients with
// the decisions counted as sluice serve counts them: Prometheus alone,
// and Prometheus with the live page's statistics (per-rule series and
// both hot-key rankings), so that the difference is their cost.
func BenchmarkMiddlewareObserved(b *testing.B) {
	p := mustPolicy(b, `
trusted_proxies: ["192.0.2.0/24"]
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm: token_bucket
    algorithm_config: {rps: 1000000000, burst: 1000000000}
`)
	ips := make([]string, 10000)
	for i := range ips {
		ips[i] = "10." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256) + ".1"
	}
	for _, withInsight := range []bool{false, true} {
		name := "metrics"
		if withInsight {
			name = "metrics+insight"
		}
		b.Run(name, func(b *testing.B) {
			opts := httpgate.Options{Metrics: metrics.New(prometheus.NewRegistry())}
			if withInsight {
				opts.Insight = insight.New(insight.Options{})
			}
			ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
			h := httpgate.Middleware(p, sluice.New(memory.New(memory.Options{})), opts)(ok)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := httptest.NewRequest("GET", "/api/orders", nil)
				req.RemoteAddr = "192.0.2.1:4000"
				w := &discard{h: http.Header{}}
				i := 0
				for pb.Next() {
					req.Header.Set("X-Forwarded-For", ips[i%len(ips)])
					i++
					clear(w.h)
					h.ServeHTTP(w, req)
				}
			})
		})
	}
}
