package httpgate_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/serverconf"
)

// BenchmarkDoor measures sluice's own work per forward-auth call (GET
// /v1/auth) and decision API take (POST /v1/take) without the network:
// the handler alone, called with a request of 10,000 users, beside a
// bare handler that answers with the same fields. "gate" is the gate
// with no metrics, "served" the gate as sluice serve builds and wraps it
// (Prometheus metrics, the live page's statistics, the store timed,
// APIServer's handler).
// bench/'s BenchmarkFrontDoor puts the same doors behind real servers.
func BenchmarkDoor(b *testing.B) {
	p := mustPolicy(b, `
rules:
  - name: per-user
    limit_keys: ["header:X-User"]
    algorithm: token_bucket
    algorithm_config: {rps: 1000000000, burst: 1000000000}
`)
	gates := map[string]func() *httpgate.Gate{
		"gate": func() *httpgate.Gate {
			return httpgate.New(p, sluice.New(memory.New(memory.Options{})), httpgate.Options{})
		},
		"served": func() *httpgate.Gate {
			m := metrics.New(prometheus.NewRegistry())
			store := memory.New(memory.Options{})
			m.WatchKeys(store)
			stats := insight.New(insight.Options{Store: "memory://", Readings: m.Values})
			m.OnStoreCall(stats.StoreCall)
			lim := sluice.New(m.InstrumentStore(store))
			return httpgate.New(p, lim, httpgate.Options{Metrics: m, Insight: stats, Delay: httpgate.ReserveDelay(time.Second)})
		},
	}
	// What sluice serve wraps around a door (httpgate.APIServer).
	served := func(h http.Handler) http.Handler {
		return httpgate.APIServer(h, serverconf.DefaultServerLimits, nil).Handler
	}
	users := make([]string, 10000)
	for i := range users {
		users[i] = "user-" + strconv.Itoa(i)
	}
	auth := map[string]func() http.Handler{
		"bare": func() http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h := w.Header()
				h.Set("Ratelimit-Policy", `"per-user";q=1000000000;w=1`)
				h.Set("Ratelimit", `"per-user";r=999999999;t=1`)
				h.Set("Ratelimit-Limit", "1000000000")
				h.Set("Ratelimit-Remaining", "999999999")
				h.Set("Ratelimit-Reset", "1")
				h.Set("Cache-Control", "no-store")
				w.WriteHeader(http.StatusOK)
			})
		},
		"gate":   func() http.Handler { return gates["gate"]().AuthHandler() },
		"served": func() http.Handler { return served(gates["served"]().AuthHandler()) },
	}
	take := map[string]func() http.Handler{
		"bare": func() http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				h := w.Header()
				h.Set("Content-Type", "application/json")
				h.Set("Cache-Control", "no-store")
				io.WriteString(w, `{"allowed":true,"limit":1000000000,"remaining":999999999,"tokens":999999999,"retry_after_ms":0,"reset_after_ms":1,"rule":"per-user","reason":""}`+"\n")
			})
		},
		"gate":   func() http.Handler { return gates["gate"]().APIHandler() },
		"served": func() http.Handler { return served(gates["served"]().APIHandler()) },
	}
	// A served request comes on a connection that APIServer's ConnContext
	// has seen, as every request of sluice serve's does.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	connCtx := httpgate.APIServer(nil, serverconf.DefaultServerLimits, nil).ConnContext(context.Background(), conn)
	newRequest := func(side, method, target string) *http.Request {
		r := httptest.NewRequest(method, target, nil)
		if side == "served" {
			r = r.WithContext(connCtx)
			r.RemoteAddr = conn.RemoteAddr().String()
		}
		return r
	}
	for _, side := range []string{"bare", "gate", "served"} {
		b.Run("auth/"+side, func(b *testing.B) {
			h := auth[side]()
			reqs := make([]*http.Request, len(users))
			for i, u := range users {
				r := newRequest(side, "GET", "/v1/auth")
				r.Header.Set("X-User", u)
				r.Header.Set("X-Forwarded-Uri", "/api/orders")
				r.Header.Set("X-Forwarded-Method", "GET")
				reqs[i] = r
			}
			serveDoor(b, h, func(i int) *http.Request { return reqs[i%len(reqs)] })
		})
		b.Run("take/"+side, func(b *testing.B) {
			h := take[side]()
			bodies := make([]*body, len(users))
			reqs := make([]*http.Request, len(users))
			for i, u := range users {
				bodies[i] = &body{s: `{"rule":"per-user","key":"` + u + `"}`}
				r := newRequest(side, "POST", "/v1/take")
				r.Header.Set("Content-Type", "application/json")
				r.Body = bodies[i]
				r.ContentLength = int64(len(bodies[i].s))
				reqs[i] = r
			}
			serveDoor(b, h, func(i int) *http.Request {
				k := i % len(reqs)
				bodies[k].r.Reset(bodies[k].s)
				return reqs[k]
			})
		})
	}
}

// serveDoor calls h with next(i) for the i-th call, on one goroutine
// (the requests of one user would race otherwise), and fails on an
// answer other than 200.
func serveDoor(b *testing.B, h http.Handler, next func(i int) *http.Request) {
	w := &recorder{h: http.Header{}}
	for i := range 20000 { // every user's bucket exists: the steady state
		clear(w.h)
		w.code = 0
		h.ServeHTTP(w, next(i))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		clear(w.h)
		w.code = 0
		h.ServeHTTP(w, next(i))
		if w.code != http.StatusOK && w.code != 0 {
			b.Fatalf("status %d", w.code)
		}
		i++
	}
}

// body is a request body read again for every call.
type body struct {
	s string
	r strings.Reader
}

func (b *body) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *body) Close() error               { return nil }

// recorder is a ResponseWriter that keeps the status and drops the body.
type recorder struct {
	h    http.Header
	code int
}

func (d *recorder) Header() http.Header { return d.h }
func (d *recorder) Write(p []byte) (int, error) {
	if d.code == 0 {
		d.code = http.StatusOK
	}
	return len(p), nil
}
func (d *recorder) WriteHeader(code int) { d.code = code }
