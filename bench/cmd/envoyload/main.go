// Command envoyload drives Envoy's RateLimitService/ShouldRateLimit over
// loopback gRPC, with the go-control-plane types Envoy itself uses, and
// reports requests per second and latency percentiles per concurrency.
//
// Many callers share a few connections (as an Envoy fleet does); every
// call carries one descriptor [user=<value>] whose value is drawn from
// 10,000 values with a Zipf skew, so a few are hot and most are cold.
//
// Without -addr it starts sluice's service in this process on a loopback
// listener, over the store -store names (memory:// or redis://HOST:PORT);
// with -addr it drives a server already running (sluice, or the reference
// server for a comparison).
//
// -client chooses the callers: grpc-go's client, a goroutine per caller
// (the default), or h2, gRPC framed by hand over HTTP/2, the callers a
// connection's streams in flight, one goroutine per connection. The h2
// client spends a fraction of grpc-go's CPU per call, so on a core shared
// with Redis the server's own core, not the client's, bounds the calls
// per second; each of its calls draws its value as the grpc client's do.
//
// With -addr, -pid and -redis-pid name the server's and Redis's
// processes: each run then also reports their CPU time per call, the
// load client's own, and the server's read and write system calls per
// call, over the measured time.
//
//	go run ./cmd/envoyload -store memory:// -callers 16,64,256
//	go run ./cmd/envoyload -store redis://127.0.0.1:16379 -callers 16,64,256
//	go run ./cmd/envoyload -addr 127.0.0.1:18484 -pid 4242 -redis-pid 4243 -callers 64
//	go run ./cmd/envoyload -addr 127.0.0.1:18484 -client h2 -callers 64
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bench"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/redis"
)

// The workload's policy: a token bucket per user, 100 per second with a
// burst of 100, like the library benchmarks'. The reference config the
// comparison ran against the reference server says the same with a fixed
// window of 100 per second (testdata/envoy-reference.yaml; see
// bench/README.md#envoy-rate-limit-service).
const policyYAML = `rules:
  - name: per-user
    match: {domain: bench}
    limit_keys: ["descriptor:user"]
    algorithm: token_bucket
    algorithm_config: {rps: 100, burst: 100}
`

func main() {
	addr := flag.String("addr", "", "server to drive (default: start sluice in this process)")
	serveOnly := flag.String("serve", "", "only serve sluice's service on this address (for a load client in another process)")
	storeURL := flag.String("store", "memory://", "store of the in-process server: memory:// or redis://HOST:PORT")
	config := flag.String("config", "", "policy of the in-process server, sluice's format or the reference server's (default: a token bucket per user, 100/s, burst 100)")
	callersFlag := flag.String("callers", "16,64,256", "concurrent callers, one run per value")
	conns := flag.Int("conns", 4, "gRPC connections the callers share")
	client := flag.String("client", "grpc", "grpc: grpc-go's client, a goroutine per caller; h2: gRPC framed by hand over HTTP/2, a goroutine per connection, its callers its streams in flight (a lighter client, as h2load is)")
	duration := flag.Duration("duration", 10*time.Second, "measured time per run")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured time before each run")
	nkeys := flag.Int("keys", 10_000, "distinct descriptor values")
	skew := flag.Float64("zipf", 1.1, "Zipf exponent of the values (> 1)")
	rate := flag.Float64("rate", 0, "offered calls per second in all (0: every caller calls again as soon as answered)")
	timeout := flag.Duration("timeout", 0, "each call's deadline, sent as grpc-timeout as Envoy sends its rate limit timeout (20ms by default there); 0: none")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole process (callers and in-process server) to this file")
	memProfile := flag.String("memprofile", "", "write an allocation profile of the whole process to this file when it ends")
	requestBody := flag.String("request-body", "", "only write one call's gRPC request body (user=user-42) to this file, for an HTTP/2 load tool such as h2load")
	serverPID := flag.Int("pid", 0, "with -addr, the server's process: report its CPU time per call")
	redisPID := flag.Int("redis-pid", 0, "the Redis server's process: report its CPU time per call")
	flag.Parse()
	if *requestBody != "" {
		if err := writeRequestBody(*requestBody); err != nil {
			fmt.Fprintln(os.Stderr, "envoyload:", err)
			os.Exit(1)
		}
		return
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		defer func() {
			f, err := os.Create(*memProfile)
			if err != nil {
				log.Fatal(err)
			}
			defer f.Close()
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				log.Fatal(err)
			}
		}()
	}

	if *serveOnly != "" {
		if err := serveForever(*serveOnly, *storeURL, *config); err != nil {
			fmt.Fprintln(os.Stderr, "envoyload:", err)
			os.Exit(1)
		}
		return
	}
	target := *addr + " (external server)"
	if *addr == "" {
		a, stop, err := serve(*storeURL, *config)
		if err != nil {
			fmt.Fprintln(os.Stderr, "envoyload:", err)
			os.Exit(1)
		}
		defer stop()
		*addr = a
		target = fmt.Sprintf("sluice in process on %s, store %s", a, *storeURL)
		if *config != "" {
			target += ", policy " + *config
		}
	}
	keys := make([]string, *nkeys)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	var drive driver
	switch *client {
	case "grpc":
		clients := make([]rlspb.RateLimitServiceClient, *conns)
		for i := range clients {
			cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				fmt.Fprintln(os.Stderr, "envoyload:", err)
				os.Exit(1)
			}
			defer cc.Close()
			clients[i] = rlspb.NewRateLimitServiceClient(cc)
		}
		drive = grpcDriver(clients, keys, *skew, *rate, *timeout)
	case "h2":
		if *rate > 0 {
			fmt.Fprintln(os.Stderr, "envoyload: -client h2 drives a closed loop only (no -rate)")
			os.Exit(2)
		}
		d, err := h2Driver(*addr, *conns, keys, *skew, *timeout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "envoyload:", err)
			os.Exit(1)
		}
		drive = d
	default:
		fmt.Fprintf(os.Stderr, "envoyload: -client is grpc or h2, not %q\n", *client)
		os.Exit(2)
	}
	mode := "closed loop"
	if *rate > 0 {
		mode = fmt.Sprintf("offered %.0f calls/s", *rate)
	}
	fmt.Printf("%s; %s client, %d connections, %d Zipf(%.2f) values, %s, %v per run\n", target, *client, *conns, *nkeys, *skew, mode, *duration)
	pids := cpuPIDs{server: *serverPID, redis: *redisPID}
	fmt.Printf("%8s %12s %10s %10s %10s %10s %8s %8s %9s%s\n", "callers", "req/s", "p50", "p90", "p99", "p99.9", "over%", "errors", "storeerr", pids.header())
	for _, f := range strings.Split(*callersFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "envoyload: bad -callers value %q\n", f)
			os.Exit(2)
		}
		run(drive, n, *warmup, *duration, pids)
	}
}

// writeRequestBody writes one ShouldRateLimit request as a gRPC message
// on the wire.
func writeRequestBody(path string) error {
	b, err := grpcMessage(request("user-42"))
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// request is the call every caller makes: one descriptor [user=value].
func request(value string) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: value}},
	}}}
}

// grpcMessage is m as a gRPC message on the wire: an uncompressed flag,
// the length, the protobuf.
func grpcMessage(m proto.Message) ([]byte, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...), nil
}

// storeErrors counts the in-process server's decisions made by a rule's
// on_store_error because the store failed (a Redis call past its
// deadline, say): answers that did not come from the store, so a run with
// any is not a measure of the store.
var storeErrors = new(errorCounter)

type errorCounter struct{ n atomic.Int64 }

func (c *errorCounter) Observe(_, result string) {
	if result == "store_error" {
		c.n.Add(1)
	}
}

// serveForever serves on addr until the process is stopped.
func serveForever(addr, storeURL, config string) error {
	g, ln, stop, err := newServer(addr, storeURL, config)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Printf("serving on %s, store %s\n", ln.Addr(), storeURL)
	// Stop cleanly on a signal, so that a CPU profile is written.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; g.Stop() }()
	return g.Serve(ln)
}

// serve starts sluice's rate limit service on a loopback port.
func serve(storeURL, config string) (string, func(), error) {
	g, ln, stop, err := newServer("127.0.0.1:0", storeURL, config)
	if err != nil {
		return "", nil, err
	}
	go g.Serve(ln)
	return ln.Addr().String(), func() { g.Stop(); stop() }, nil
}

func newServer(addr, storeURL, config string) (*grpc.Server, net.Listener, func(), error) {
	name, data := "envoyload", []byte(policyYAML)
	if config != "" {
		b, err := os.ReadFile(config)
		if err != nil {
			return nil, nil, nil, err
		}
		name, data = config, b
	}
	var pol *policy.Policy
	var err error
	if envoyrls.IsReferenceConfig(data) {
		pol, err = envoyrls.ParseReferenceConfig(name, data)
	} else {
		pol, err = policy.Parse(name, data)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	var store sluice.Store
	closeStore := func() {}
	switch {
	case strings.HasPrefix(storeURL, "memory://"):
		store = memory.New(memory.Options{})
	case strings.HasPrefix(storeURL, "redis"):
		s, err := redis.Open(storeURL, redis.Options{})
		if err != nil {
			return nil, nil, nil, err
		}
		store, closeStore = s, func() { s.Close() }
	default:
		return nil, nil, nil, fmt.Errorf("unknown store %q", storeURL)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		closeStore()
		return nil, nil, nil, err
	}
	g := grpc.NewServer(envoyrls.ServerOptions()...)
	envoyrls.New(pol, sluice.New(store), envoyrls.Options{Logger: slog.New(slog.DiscardHandler), Observer: storeErrors}).Register(g)
	return g, ln, closeStore, nil
}

// load is one run's shared state: whether it is being measured, whether
// it is to stop, and its tallies, which a driver adds to.
type load struct {
	measuring, stop   atomic.Bool
	calls, over, errs atomic.Int64 // while measuring
}

// driver starts callers concurrent callers on l and returns a function
// that, once l.stop is set, waits for them and returns the latencies
// each measured.
type driver func(l *load, callers int) (wait func() [][]time.Duration)

// grpcDriver drives the server through grpc-go's client, the callers
// sharing clients' connections. With rate > 0 each caller sends at its
// share of the rate on a fixed schedule and latency counts from the
// scheduled time, so a slow answer also counts against the calls queued
// behind it.
func grpcDriver(clients []rlspb.RateLimitServiceClient, keys []string, skew, rate float64, timeout time.Duration) driver {
	return func(l *load, callers int) func() [][]time.Duration {
		lat := make([][]time.Duration, callers)
		var wg sync.WaitGroup
		for c := 0; c < callers; c++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(c), 42))
				z := rand.NewZipf(rng, skew, 1, uint64(len(keys)-1))
				cl := clients[c%len(clients)]
				ls := make([]time.Duration, 0, 1<<16)
				var every time.Duration
				next := time.Now()
				if rate > 0 {
					every = time.Duration(float64(callers) / rate * float64(time.Second))
					next = next.Add(time.Duration(rng.Int64N(int64(every)))) // spread the callers' phases
				}
				for !l.stop.Load() {
					req := request(keys[z.Uint64()])
					t := time.Now()
					if every > 0 {
						// On schedule, the call starts when the timer wakes (its
						// lateness is not the server's); behind schedule, the
						// wait since the call was due counts too.
						if w := next.Sub(t); w > 0 {
							time.Sleep(w)
							t = time.Now()
						} else {
							t = next
						}
						next = next.Add(every)
					}
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if timeout > 0 {
						ctx, cancel = context.WithTimeout(ctx, timeout)
					}
					resp, err := cl.ShouldRateLimit(ctx, req)
					cancel()
					d := time.Since(t)
					if !l.measuring.Load() {
						continue
					}
					ls = append(ls, d)
					l.calls.Add(1)
					switch {
					case err != nil:
						l.errs.Add(1)
					case resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT:
						l.over.Add(1)
					}
				}
				lat[c] = ls
			}(c)
		}
		return func() [][]time.Duration { wg.Wait(); return lat }
	}
}

// run drives callers concurrent callers for warmup+duration and prints
// one line of results.
func run(drive driver, callers int, warmup, duration time.Duration, pids cpuPIDs) {
	l := new(load)
	wait := drive(l, callers)
	time.Sleep(warmup)
	storeErrs0 := storeErrors.n.Load()
	l.measuring.Store(true)
	cpu0 := pids.read()
	began := time.Now()
	time.Sleep(duration)
	l.measuring.Store(false)
	elapsed := time.Since(began)
	cpu := pids.read()
	storeErrs := storeErrors.n.Load() - storeErrs0
	l.stop.Store(true)
	var all []time.Duration
	for _, ls := range wait() {
		all = append(all, ls...)
	}
	if len(all) == 0 {
		fmt.Printf("%8d no calls completed\n", callers)
		return
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	fmt.Printf("%8d %12.0f %10v %10v %10v %10v %7.1f%% %8d %9d%s\n", callers, float64(len(all))/elapsed.Seconds(),
		pct(0.50).Round(time.Microsecond), pct(0.90).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), pct(0.999).Round(time.Microsecond),
		100*float64(l.over.Load())/float64(len(all)), l.errs.Load(), storeErrs, pids.perCall(cpu0, cpu, len(all)))
	if storeErrs > 0 {
		fmt.Printf("%8s %d answers came from on_store_error, not the store: not a measure of the store (for a saturated closed loop, give the store a longer ?timeout=)\n", "", storeErrs)
	}
}

// cpuPIDs are the processes whose CPU time a run reports per call: the
// server's and the Redis server's (0: not reported). A call counts when
// it is answered within the measured time, as for calls/s.
type cpuPIDs struct{ server, redis int }

// header names the columns perCall fills: with -pid or -redis-pid, the
// load client's own CPU time per call comes first, since on a shared core
// the client's cost bounds the calls per second as much as the server's.
func (p cpuPIDs) header() string {
	if p.server == 0 && p.redis == 0 {
		return ""
	}
	h := fmt.Sprintf(" %12s", "client-µs")
	if p.server != 0 {
		h += fmt.Sprintf(" %12s %9s", "server-µs", "reads+writes")
	}
	if p.redis != 0 {
		h += fmt.Sprintf(" %12s", "redis-µs")
	}
	return h
}

// cpuReading is the processes' CPU time so far, and the server's read
// and write system calls.
type cpuReading struct {
	cpu      [2]time.Duration
	self     time.Duration
	syscalls [2]int64
}

func (p cpuPIDs) read() cpuReading {
	r := cpuReading{cpu: [2]time.Duration{cpuClock(p.server), cpuClock(p.redis)}, syscalls: ioCalls(p.server)}
	if p.server != 0 || p.redis != 0 {
		r.self = cpuClock(os.Getpid())
	}
	return r
}

func (p cpuPIDs) perCall(before, after cpuReading, calls int) string {
	if p.server == 0 && p.redis == 0 {
		return ""
	}
	s := fmt.Sprintf(" %12.2f", float64((after.self-before.self).Nanoseconds())/1e3/float64(calls))
	for i, pid := range [2]int{p.server, p.redis} {
		if pid != 0 {
			s += fmt.Sprintf(" %12.2f", float64((after.cpu[i]-before.cpu[i]).Nanoseconds())/1e3/float64(calls))
		}
		if i == 0 && pid != 0 {
			s += fmt.Sprintf(" %4.2f+%4.2f", float64(after.syscalls[0]-before.syscalls[0])/float64(calls), float64(after.syscalls[1]-before.syscalls[1])/float64(calls))
		}
	}
	return s
}

// ioCalls is the read and write system calls of process pid so far
// (syscr and syscw of /proc/PID/io), or 0 where they cannot be read.
func ioCalls(pid int) (n [2]int64) {
	if pid == 0 {
		return n
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return n
	}
	for _, line := range strings.Split(string(b), "\n") {
		for i, field := range [2]string{"syscr: ", "syscw: "} {
			if v, ok := strings.CutPrefix(line, field); ok {
				n[i], _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return n
}

// cpuClock is the CPU time of process pid so far (bench.ProcessCPU); 0
// for pid 0.
func cpuClock(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	d, err := bench.ProcessCPU(pid)
	if err != nil {
		log.Fatal(err)
	}
	return d
}
