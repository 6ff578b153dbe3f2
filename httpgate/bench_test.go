package httpgate_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
)

// BenchmarkMiddleware measures the per-request cost of the middleware
// (match, enforce on the memory store, headers) without the network:
// one client, and one per request from a pool of 10000 addresses.
func BenchmarkMiddleware(b *testing.B) {
	p := mustPolicy(b, `
trusted_proxies: ["192.0.2.0/24"]
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm: token_bucket
    algorithm_config: {rps: 1000000000, burst: 1000000000}
`)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	h := httpgate.Middleware(p, sluice.New(memory.New(memory.Options{})), httpgate.Options{})(ok)
	ips := make([]string, 10000)
	for i := range ips {
		ips[i] = "10." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256) + ".1"
	}
	for _, many := range []bool{false, true} {
		name := "one-client"
		if many {
			name = "10000-clients"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req := httptest.NewRequest("GET", "/api/orders", nil)
				req.RemoteAddr = "192.0.2.1:4000"
				w := &discard{h: http.Header{}}
				i := 0
				for pb.Next() {
					if many {
						req.Header.Set("X-Forwarded-For", ips[i%len(ips)])
						i++
					}
					clear(w.h)
					h.ServeHTTP(w, req)
				}
			})
		})
	}
}

// BenchmarkRateLimitHeaders measures building the response fields alone.
func BenchmarkRateLimitHeaders(b *testing.B) {
	p := mustPolicy(b, tightPolicy)
	g := httpgate.New(p, sluice.New(memory.New(memory.Options{})), httpgate.Options{})
	req := httptest.NewRequest("GET", "/x", nil)
	v, _, err := g.Check(req.Context(), p.FromHTTP(req))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		httpgate.RateLimitHeaders(v, "ip:192.0.2.1", "/x", nil)
	}
}

type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return io.Discard.Write(p) }
func (d *discard) WriteHeader(int)             {}
