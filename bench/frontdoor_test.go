package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/serverconf"
)

// BenchmarkFrontDoor puts each of sluice's front doors beside the floor
// under it, in one process and one run: forward auth (GET /v1/auth) and
// the decision API (POST /v1/take) beside a bare net/http handler that
// answers with the same fields (and, for a take, the same body), and the
// Envoy rate limit service beside a no-op RateLimitService that answers
// the same fields (see frontDoorGRPC, which also measures the gRPC stack
// itself). The gate is built and served as sluice serve builds and serves
// it (metrics, live page statistics, the API server's wrapping and cap on
// connections); the bare handler has the same server deadlines and
// bounds, and nothing else. One load
// client drives both servers of a pair over loopback in alternating rounds
// (so that the machine's other load falls on both alike), over 10,000
// user values.
//
// It reports each side's calls per second, their ratio, and the process
// CPU (getrusage) per call of each side. Client and server share the
// process, so the CPU per call includes the client's; the client's work
// is the same for both sides, so the difference (extra-µs/op) is what the
// door itself adds over the floor.
//
// Run it once per invocation (each round is time-based):
//
//	go test -run '^$' -bench FrontDoor -benchtime 1x
//
// FRONTDOOR_ROUNDS (default 4), FRONTDOOR_ROUND (default 1s) and
// FRONTDOOR_CONNS (default 16) change the rounds and the connections.
func BenchmarkFrontDoor(b *testing.B) {
	rounds := envInt("FRONTDOOR_ROUNDS", 4)
	round := envDuration("FRONTDOOR_ROUND", time.Second)
	conns := envInt("FRONTDOOR_CONNS", 16)
	users := make([]string, workloadKeys)
	for i := range users {
		users[i] = "user-" + strconv.Itoa(i)
	}

	b.Run("auth", func(b *testing.B) {
		bare := startHTTP(b, http.HandlerFunc(BareAuth))
		gate := startGate(b, (*httpgate.Gate).AuthHandler)
		reqs := make([]*http.Request, len(users))
		for i, u := range users {
			reqs[i] = mustRequest(b, "GET", "/v1/auth", nil)
			reqs[i].Header.Set("X-User", u)
			reqs[i].Header.Set("X-Forwarded-Uri", "/api/orders")
			reqs[i].Header.Set("X-Forwarded-Method", "GET")
		}
		compare(b, rounds, round, conns, "bare", "sluice",
			httpCaller(bare, conns, reqs, http.StatusOK),
			httpCaller(gate, conns, reqs, http.StatusOK))
	})

	b.Run("take", func(b *testing.B) {
		bare := startHTTP(b, http.HandlerFunc(BareTake))
		gate := startGate(b, (*httpgate.Gate).APIHandler)
		bodies := make([][]byte, len(users))
		for i, u := range users {
			bodies[i] = []byte(`{"rule":"per-user","key":"` + u + `"}`)
		}
		compare(b, rounds, round, conns, "bare", "sluice",
			takeCaller(bare, conns, bodies),
			takeCaller(gate, conns, bodies))
	})

	frontDoorGRPC(b, rounds, round, conns, users)
}

// frontDoorGate is sluice's gate on the memory store with one rule keyed
// by user that never refuses, so that both sides answer 200, built as
// sluice serve builds it: Prometheus metrics, the live page's statistics
// and the store's calls timed for both.
func frontDoorGate(b *testing.B) *httpgate.Gate {
	p, err := policy.Parse("frontdoor.yaml", []byte(`
rules:
  - name: per-user
    limit_keys: ["header:X-User"]
    algorithm: token_bucket
    algorithm_config: {rps: 1000000000, burst: 1000000000}
`))
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	store := memory.New(memory.Options{})
	m.WatchKeys(store)
	stats := insight.New(insight.Options{Store: "memory://", Readings: m.Values})
	m.OnStoreCall(stats.StoreCall)
	lim := sluice.New(m.InstrumentStore(store))
	return httpgate.New(p, lim, httpgate.Options{
		Metrics: m,
		Logger:  slog.New(slog.DiscardHandler),
		Delay:   httpgate.ReserveDelay(serverLimits.WriteTimeout),
		Insight: stats,
	})
}

// serverLimits are sluice serve's default deadlines and bounds, which
// both sides of the HTTP pairs are served with.
var serverLimits = serverconf.DefaultServerLimits

// startGate serves the handler that door picks of frontDoorGate as sluice
// serve serves it (httpgate.APIServer, with its cap on connections).
func startGate(b *testing.B, door func(*httpgate.Gate) http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	lc := httpgate.LimitConns(ln, serverconf.DefaultMaxConns)
	srv := httpgate.APIServer(door(frontDoorGate(b)), serverLimits, lc)
	go srv.Serve(lc)
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// caller makes calls on one connection's worth of state (worker w of the
// client) until it returns an error.
type caller func(w, i int) error

// compare runs rounds alternating a and b (a first on odd rounds, b first
// on even ones) and reports both sides and their ratio.
func compare(b *testing.B, rounds int, round time.Duration, conns int, aName, bName string, a, c caller) {
	var calls [2]int64
	var cpu [2]time.Duration
	var wall [2]time.Duration
	sides := [2]caller{a, c}
	// Warm both up: connections, the store's keys, the runtime's pools.
	for s := range sides {
		drive(b, sides[s], conns, round/4)
	}
	for r := range rounds {
		for k := range 2 {
			s := k
			if r%2 == 1 {
				s = 1 - k
			}
			c0 := processCPU()
			t0 := time.Now()
			n := drive(b, sides[s], conns, round)
			wall[s] += time.Since(t0)
			cpu[s] += processCPU() - c0
			calls[s] += n
		}
	}
	rate := func(s int) float64 { return float64(calls[s]) / wall[s].Seconds() }
	perCall := func(s int) float64 { return float64(cpu[s].Microseconds()) / float64(calls[s]) }
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(rate(0), aName+"-calls/s")
	b.ReportMetric(rate(1), bName+"-calls/s")
	b.ReportMetric(rate(1)/rate(0), "ratio")
	b.ReportMetric(perCall(0), aName+"-cpu-µs/op")
	b.ReportMetric(perCall(1), bName+"-cpu-µs/op")
	b.ReportMetric(perCall(1)-perCall(0), "extra-µs/op")
}

// drive is Drive, failing b on the first error.
func drive(b *testing.B, call caller, conns int, d time.Duration) int64 {
	n, err := Drive(call, conns, d, 0)
	if err != nil {
		b.Error(err)
	}
	return n
}

// processCPU is the user and system CPU time of the process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startHTTP serves h on a bare http.Server with the deadlines and bounds
// that sluice serve gives its own.
func startHTTP(b *testing.B, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := BareServer(h)
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

func mustRequest(b *testing.B, method, path string, body []byte) *http.Request {
	r, err := http.NewRequest(method, path, bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// httpClient keeps conns keep-alive connections to one server.
func httpClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		DisableCompression:  true,
	}}
}

// httpCaller sends reqs (templates without a host) to base, expecting want.
func httpCaller(base string, conns int, reqs []*http.Request, want int) caller {
	cl := httpClient(conns)
	u := mustRequestURL(base)
	return func(_, i int) error {
		r := reqs[i%len(reqs)].Clone(context.Background())
		r.URL.Scheme, r.URL.Host, r.Host = u.URL.Scheme, u.URL.Host, u.URL.Host
		resp, err := cl.Do(r)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("%s: status %d, want %d", base, resp.StatusCode, want)
		}
		return nil
	}
}

func takeCaller(base string, conns int, bodies [][]byte) caller {
	cl := httpClient(conns)
	url := base + "/v1/take"
	return func(_, i int) error {
		resp, err := cl.Post(url, "application/json", bytes.NewReader(bodies[i%len(bodies)]))
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: status %d", url, resp.StatusCode)
		}
		return nil
	}
}

func mustRequestURL(base string) *http.Request {
	r, err := http.NewRequest("GET", base, nil)
	if err != nil {
		panic(err)
	}
	return r
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}
