// Command frontdoor measures sluice's front doors against their floors
// with each server in a process of its own, so that servers and load
// client run on cores of their own (bench/frontdoor.sh pins them with
// taskset) and the server's CPU per call is read from its process's CPU
// clock, apart from the client's. BenchmarkFrontDoor measures the same in
// one process, for a machine with too few cores to pin.
//
//	frontdoor bare -listen 127.0.0.1:18490   # net/http answering /v1/auth and /v1/take as sluice does
//	frontdoor noop -listen 127.0.0.1:18491   # a RateLimitService answering OK, on sluice's gRPC server options
//	frontdoor bareproxy -listen 127.0.0.1:18493 -upstream http://127.0.0.1:18490   # a Go reverse proxy deciding nothing
//	frontdoor load -door auth -addr 127.0.0.1:18490 -pid PID -conns 64 -duration 10s [-rate 20000]
//	frontdoor pair -door auth -floor 127.0.0.1:18490 -floor-pid PID -addr 127.0.0.1:18492 -pid PID -slice 250ms -pairs 40
//	frontdoor medians -door auth -- 0.8 -0.1 0.6 ...   # the extras of pair runs on servers started afresh for each
//
// load prints one line: the door, calls, calls per second, and the
// server's CPU per call in µs (see cpuClock).
//
// pair drives the floor and sluice alternately in short slices (floor
// first in one pair, sluice first in the next) and reports, over the
// pairs, the median and 95% interval of sluice's CPU per call over the
// floor's, of the floor's CPU per call over sluice's (the calls/s ratio
// of a saturated server) and of the calls/s ratio as driven (see
// bench.Summarize). Pairing slices a fraction of a second apart cancels
// the drift of a shared machine, which moves a whole round's CPU per
// call by more than the difference measured. A server's CPU is read
// from its process's CPU clock, to the nanosecond, when each of its
// slices starts: a slice is charged everything the process did until
// its next one.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bench"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/gcgoal"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

func main() {
	log.SetFlags(0)
	if len(os.Args) < 2 {
		log.Fatal("usage: frontdoor bare|noop|bareproxy|load|pair|medians [flags]")
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on (bare, noop, bareproxy)")
	upstream := fs.String("upstream", "", "where bareproxy sends every request")
	door := fs.String("door", "auth", "what load drives: auth (GET /v1/auth), take (POST /v1/take) or grpc (ShouldRateLimit)")
	addr := fs.String("addr", "", "server to drive (load)")
	pid := fs.Int("pid", 0, "the server's process, whose CPU load reports (load)")
	conns := fs.Int("conns", 64, "concurrent callers (load); gRPC callers share 4 connections")
	duration := fs.Duration("duration", 10*time.Second, "measured time (load)")
	warmup := fs.Duration("warmup", time.Second, "unmeasured time first (load)")
	perSecond := fs.Float64("rate", 0, "calls per second offered by all callers together (load, pair); 0: each calls again once answered")
	floorAddr := fs.String("floor", "", "the floor server to drive (pair); -addr and -pid are sluice's")
	floorPID := fs.Int("floor-pid", 0, "the floor server's process (pair)")
	slice := fs.Duration("slice", 250*time.Millisecond, "time on each side of a pair (pair)")
	pairs := fs.Int("pairs", 40, "pairs of slices (pair)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the server to this file when it is interrupted (bare, noop), as sluice serve -cpuprofile does")
	fs.Parse(os.Args[2:])
	if *cpuProfile != "" {
		stop := profileCPU(*cpuProfile)
		go func() {
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
			<-sig
			stop()
			os.Exit(0)
		}()
	}
	if os.Args[1] == "bare" || os.Args[1] == "noop" || os.Args[1] == "bareproxy" {
		// The floors collect garbage as sluice serve does, so that the
		// difference is the door's own work.
		defer gcgoal.Start(gcgoal.ServeFloor, time.Second)()
	}
	switch os.Args[1] {
	case "medians":
		// The medians of separate pair runs (frontdoor.sh with RESTARTS):
		// each run's servers are processes of their own, so the runs vary
		// by what differs between processes, which one run's pairs cannot
		// show; the interval over runs includes it.
		var xs []float64
		for _, a := range fs.Args() {
			x, err := strconv.ParseFloat(a, 64)
			if err != nil {
				log.Fatalf("medians: %q is not a number", a)
			}
			xs = append(xs, x)
		}
		iv := bench.MedianInterval(xs)
		fmt.Printf("%s: %d runs with servers of their own; extra µs/call %.2f (%.2f to %.2f) over the runs' medians\n", *door, len(xs), iv.Median, iv.Lo, iv.Hi)
		return
	case "bare":
		ln := mustListen(*listen)
		srv := bench.BareServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/take" {
				bench.BareTake(w, r)
				return
			}
			bench.BareAuth(w, r)
		}))
		log.Fatal(srv.Serve(ln))
	case "bareproxy":
		up, err := url.Parse(*upstream)
		if err != nil || up.Host == "" {
			log.Fatalf("bareproxy: -upstream %q is not a URL with a host", *upstream)
		}
		ln := mustListen(*listen)
		log.Fatal(bench.BareServer(bench.BareProxy(up)).Serve(ln))
	case "noop":
		ln := mustListen(*listen)
		pol, err := policy.Parse("frontdoor", []byte(bench.GRPCPolicy))
		if err != nil {
			log.Fatal(err)
		}
		noop, err := bench.NoopLikeSluice(envoyrls.New(pol, sluice.New(memory.New(memory.Options{})), envoyrls.Options{Logger: slog.New(slog.DiscardHandler)}))
		if err != nil {
			log.Fatal(err)
		}
		g := grpc.NewServer(envoyrls.ServerOptions()...)
		rlspb.RegisterRateLimitServiceServer(g, noop)
		log.Fatal(g.Serve(ln))
	case "load":
		call, err := caller(*door, *addr, *conns)
		if err != nil {
			log.Fatal(err)
		}
		drive(call, *conns, *warmup, *perSecond)
		c0 := cpuClock(*pid)
		t0 := time.Now()
		n := drive(call, *conns, *duration, *perSecond)
		wall := time.Since(t0)
		cpu := cpuClock(*pid) - c0
		fmt.Printf("%s calls %d calls/s %.0f server-cpu-µs/call %.2f\n", *door, n, float64(n)/wall.Seconds(), float64(cpu.Microseconds())/float64(n))
	case "pair":
		floor, err := caller(*door, *floorAddr, *conns)
		if err != nil {
			log.Fatal(err)
		}
		mine, err := caller(*door, *addr, *conns)
		if err != nil {
			log.Fatal(err)
		}
		sides := [2]func(w, i int) error{floor, mine}
		pids := [2]int{*floorPID, *pid}
		for s := range sides {
			drive(sides[s], *conns, *warmup, *perSecond)
		}
		// A slice is charged all its server did from the slice's start to
		// the start of that server's next slice (or the same time after
		// the last): the garbage collection and the timers that run after
		// its last answer are its work too.
		var open [2]*bench.Side
		var since [2]time.Duration
		charge := func(s int) {
			c := cpuClock(pids[s])
			if open[s] != nil {
				open[s].CPU = (c - since[s]).Seconds()
			}
			since[s] = c
		}
		ps := make([]bench.Pair, *pairs)
		for k := range ps {
			got := [2]*bench.Side{&ps[k].Floor, &ps[k].Sluice}
			for j := range 2 {
				s := j ^ k%2 // floor first in even pairs, sluice first in odd ones
				charge(s)
				t0 := time.Now()
				n := drive(sides[s], *conns, *slice, *perSecond)
				*got[s] = bench.Side{Calls: n, Wall: time.Since(t0).Seconds()}
				open[s] = got[s]
			}
		}
		time.Sleep(*slice)
		charge(0)
		charge(1)
		var fl, sl bench.Side
		for _, p := range ps {
			fl.Calls, fl.Wall, fl.CPU = fl.Calls+p.Floor.Calls, fl.Wall+p.Floor.Wall, fl.CPU+p.Floor.CPU
			sl.Calls, sl.Wall, sl.CPU = sl.Calls+p.Sluice.Calls, sl.Wall+p.Sluice.Wall, sl.CPU+p.Sluice.CPU
		}
		sum := bench.Summarize(ps)
		iv := func(f string, v bench.Interval) string {
			return fmt.Sprintf(f+" ("+f+" to "+f+")", v.Median, v.Lo, v.Hi)
		}
		fmt.Printf("%s: %d pairs of %v; floor %.0f calls/s %.2f µs/call, sluice %.0f calls/s %.2f µs/call; extra µs/call %s, cpu ratio %s, calls/s ratio %s\n",
			*door, sum.Pairs, *slice, fl.Rate(), fl.PerCall(), sl.Rate(), sl.PerCall(),
			iv("%.2f", sum.Extra), iv("%.3f", sum.CPURatio), iv("%.3f", sum.RateRatio))
	default:
		log.Fatalf("frontdoor: unknown command %q", os.Args[1])
	}
}

func mustListen(addr string) net.Listener {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr())
	return ln
}

// caller returns the call that worker w makes with sequence number i.
func caller(door, addr string, conns int) (func(w, i int) error, error) {
	users := bench.Users()
	switch door {
	case "auth":
		cl := client(conns)
		url := "http://" + addr + "/v1/auth"
		return func(_, i int) error {
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set("X-User", users[i%len(users)])
			req.Header.Set("X-Forwarded-Uri", "/api/orders")
			req.Header.Set("X-Forwarded-Method", "GET")
			return do(cl, req)
		}, nil
	case "take":
		cl := client(conns)
		url := "http://" + addr + "/v1/take"
		bodies := make([][]byte, len(users))
		for i, u := range users {
			bodies[i] = []byte(`{"rule":"per-user","key":"` + u + `"}`)
		}
		return func(_, i int) error {
			req, _ := http.NewRequest("POST", url, bytes.NewReader(bodies[i%len(bodies)]))
			req.Header.Set("Content-Type", "application/json")
			return do(cl, req)
		}, nil
	case "grpc":
		clients := make([]rlspb.RateLimitServiceClient, 4)
		for i := range clients {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, err
			}
			clients[i] = rlspb.NewRateLimitServiceClient(cc)
		}
		reqs := make([]*rlspb.RateLimitRequest, len(users))
		for i, u := range users {
			reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
				Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: u}},
			}}}
		}
		return func(w, i int) error {
			resp, err := clients[w%len(clients)].ShouldRateLimit(context.Background(), reqs[i%len(reqs)])
			if err != nil {
				return err
			}
			if resp.OverallCode != rlspb.RateLimitResponse_OK {
				return fmt.Errorf("%s: %v", addr, resp.OverallCode)
			}
			return nil
		}, nil
	}
	return nil, fmt.Errorf("unknown door %q: auth, take or grpc", door)
}

func client(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, DisableCompression: true}}
}

func do(cl *http.Client, req *http.Request) error {
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", req.URL, resp.StatusCode)
	}
	return nil
}

// drive is bench.Drive, exiting on the first error.
func drive(call func(w, i int) error, conns int, d time.Duration, perSecond float64) int64 {
	n, err := bench.Drive(call, conns, d, perSecond)
	if err != nil {
		log.Fatal(err)
	}
	return n
}

// profileCPU starts a CPU profile into file and returns what ends it.
func profileCPU(file string) func() {
	f, err := os.Create(file)
	if err != nil {
		log.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		log.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// cpuClock is the CPU time of process pid so far (bench.ProcessCPU).
func cpuClock(pid int) time.Duration {
	d, err := bench.ProcessCPU(pid)
	if err != nil {
		log.Fatalf("server CPU: %v", err)
	}
	return d
}
