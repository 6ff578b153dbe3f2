package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/policy"
)

func init() {
	commands["serve"] = command{"serve the decision API, forward auth, proxy and metrics", func(args []string, _, stderr io.Writer) int {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		defer stop()
		return serve(ctx, args, stderr, nil)
	}}
}

// server is what serve has built, for the listeners that other files add
// (see startGRPC).
type server struct {
	// Gate holds the policy in force (Gate.Policy, replaced on reload) and
	// decides requests (Gate.Check).
	Gate     *httpgate.Gate
	Limiter  *sluice.Limiter
	Metrics  *metrics.Metrics
	Registry *prometheus.Registry
	Logger   *slog.Logger
}

// startGRPC, when set (the Envoy rate limit service's file sets it from
// its init), starts the gRPC listener on set.GRPCListen once the HTTP
// listener runs and returns the address it listens on. It must not block;
// serve calls stop on shutdown.
var startGRPC func(ctx context.Context, s *server, set policy.Settings) (addr string, stop func(), err error)

// reloadPoll is how often serve checks the config file for changes.
var reloadPoll = time.Second

// listening reports the addresses serve listens on, for tests.
type listening struct {
	API, Proxy, GRPC string
	// Decision is api_listen's address, when the decision API has a
	// listener of its own.
	Decision string
}

// serve runs until ctx is done; ready, when not nil, is called once the
// listeners accept connections.
func serve(ctx context.Context, args []string, stderr io.Writer, ready func(listening)) int {
	fs := newFlagSet("serve", "usage: sluice serve [--config FILE] [--listen ADDR] [--proxy-listen ADDR] [--grpc-listen ADDR|off]\n\nWithout --config, serves the embedded default policy: per client IP, 10\nrequests per second, burst 20, memory store. The flags override the policy's\naddresses. SIGHUP, or a change to the file, reloads the policy (an invalid\none is refused and the old one keeps serving); SIGTERM or SIGINT drains\n/readyz and shuts down.", stderr)
	config := fs.String("config", "", "policy file (YAML or JSON); default: the embedded per-IP policy")
	listen := fs.String("listen", "", "forward auth address, and the decision API's unless api_listen is set (overrides the policy's listen)")
	proxyListen := fs.String("proxy-listen", "", "reverse proxy address (overrides proxy.listen)")
	apiListen := fs.String("api-listen", "", "decision API address, apart from forward auth (overrides api_listen)")
	grpcListen := fs.String("grpc-listen", "", "Envoy rate limit service address (overrides grpc_listen; \"off\" disables it)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (at shutdown), for go tool pprof")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sluice serve: cpu profile: %v\n", err)
			return 1
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}

	var p *policy.Policy
	var sum [32]byte // of the file in force
	source, data := "embedded default", []byte(policy.DefaultYAML)
	if *config == "" {
		p = policy.Default()
	} else {
		source = *config
		var err error
		data, err = os.ReadFile(*config)
		if err == nil {
			sum = sha256.Sum256(data)
			p, err = parsePolicy(*config, data) // sluice's format or envoyproxy/ratelimit's
		}
		if err != nil {
			fmt.Fprintf(stderr, "sluice serve: %v\n", err)
			return 1
		}
	}
	logWarnings(log, p.Warnings)
	set := p.Settings
	if *listen != "" {
		set.Listen = *listen
		if set.GRPCListenDerived {
			set.GRPCListen = policy.DefaultGRPCListen(set.Listen) // private when the API is
		}
	}
	if *proxyListen != "" {
		set.ProxyListen = *proxyListen
	}
	if *apiListen != "" {
		set.APIListen = *apiListen
	}
	switch *grpcListen {
	case "":
	case "off":
		set.GRPCListen = ""
	default:
		set.GRPCListen = *grpcListen
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	store, closeStore, err := openStore(ctx, set.StoreURL, reg)
	if err != nil {
		fmt.Fprintf(stderr, "sluice serve: %v\n", err)
		return 1
	}
	defer closeStore()

	metrics := metrics.New(reg)
	metrics.WatchKeys(store)
	// The live page's statistics (/ui, /v1/stats), fed by every decision
	// and store call.
	stats := insight.New(insight.Options{Store: redact(set.StoreURL), Readings: metrics.Values})
	stats.Loaded(source, data, false, nil)
	metrics.OnStoreCall(stats.StoreCall)
	lim := sluice.New(metrics.InstrumentStore(store))

	var audit *httpgate.Audit
	if set.AuditLog != "" {
		f, err := os.OpenFile(set.AuditLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			fmt.Fprintf(stderr, "sluice serve: audit log: %v\n", err)
			return 1
		}
		defer f.Close()
		audit = httpgate.NewAudit(f)
	}
	limits := set.Server.WithDefaults()
	gate := httpgate.New(p, lim, httpgate.Options{Metrics: metrics, Audit: audit, Logger: log, Delay: reserveDelay(limits.WriteTimeout), Insight: stats})
	srv := &server{Gate: gate, Limiter: lim, Metrics: metrics, Registry: reg, Logger: log}

	// Rules kept in PostgreSQL (store.url postgres://...?sluice_rules=true)
	// join the file's; the source installs the merged policy now and after
	// every change to the table.
	rules, stopRules, err := startPostgresRules(ctx, set.StoreURL, store, source, data, gate.SetPolicy)
	if err != nil {
		fmt.Fprintf(stderr, "sluice serve: %v\n", err)
		return 1
	}
	if stopRules != nil {
		defer stopRules()
	}

	// Listeners: forward auth and the decision API (together on listen, or
	// the decision API on api_listen), then the optional proxy and gRPC.
	// Each HTTP listener has the server section's deadlines and a cap on
	// its connections.
	nHTTP := 1
	for _, a := range []string{set.APIListen, set.ProxyUpstream} {
		if a != "" {
			nHTTP++
		}
	}
	nofile := openFileLimit()
	conns := maxConns(limits.MaxConns, nofile, nHTTP)
	if nofile > 0 && uint64(conns*nHTTP) > nofile {
		log.Warn("server.max_conns exceeds the open file limit: slow clients can exhaust file descriptors before the cap stops them", "max_conns", conns, "listeners", nHTTP, "open_file_limit", nofile)
	}
	var servers []*http.Server
	errc := make(chan error, 3)
	start := func(name, addr string, h http.Handler, mk func(http.Handler, policy.ServerLimits, *connLimiter) *http.Server) (string, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return "", fmt.Errorf("%s: listen %s: %w", name, addr, err)
		}
		lc := limitConns(ln, conns)
		hs := mk(h, limits, lc)
		servers = append(servers, hs)
		go func() {
			if err := hs.Serve(lc); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}()
		log.Info("listening", "server", name, "addr", ln.Addr().String(), "policy", p.Source, "store", redact(set.StoreURL), "max_conns", conns)
		return ln.Addr().String(), nil
	}
	shutdown := func() {
		gate.Drain()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, hs := range servers {
			hs.Shutdown(sctx)
		}
	}
	var addrs listening
	if set.APIListen == "" {
		addrs.API, err = start("api", set.Listen, gate.Handler(), apiServer)
		addrs.Decision = addrs.API
	} else {
		addrs.API, err = start("auth", set.Listen, gate.AuthHandler(), apiServer)
		if err == nil {
			addrs.Decision, err = start("api", set.APIListen, gate.APIHandler(), apiServer)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice serve: %v\n", err)
		shutdown()
		return 1
	}
	if set.APITokenEnv == "" && !loopback(addrs.Decision) {
		log.Warn("the decision API is open to anyone who reaches it: /v1/take can drain any bucket; set api_token_env, or api_listen on a private address", "addr", addrs.Decision)
	}
	if set.ProxyUpstream != "" {
		up, err := url.Parse(set.ProxyUpstream)
		if err == nil {
			addrs.Proxy, err = start("proxy", set.ProxyListen, gate.Proxy(up, httpgate.ProxyOptions{ResponseHeaderTimeout: set.ProxyUpstreamTimeout}), proxyServer)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sluice serve: proxy: %v\n", err)
			shutdown()
			return 1
		}
	}
	if startGRPC != nil && set.GRPCListen != "" {
		var stop func()
		addrs.GRPC, stop, err = startGRPC(ctx, srv, set)
		if err != nil {
			fmt.Fprintf(stderr, "sluice serve: grpc: %v\n", err)
			shutdown()
			return 1
		}
		defer stop()
	}
	// Reload on SIGHUP and when the file's content changes.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if ready != nil {
		ready(addrs)
	}
	tick := time.NewTicker(reloadPoll)
	defer tick.Stop()
	// A change is applied once two polls in a row see the same content,
	// so that a file caught half-written is not refused (or worse, half
	// applied) before the writer finishes.
	var pending [32]byte
	reload := func(why string, force bool) {
		if *config == "" {
			return
		}
		data, err := os.ReadFile(*config)
		if err != nil {
			// A file being replaced may vanish for a moment; the next
			// poll sees the new one.
			if force {
				log.Error("reload refused, keeping the policy in force", "why", why, "err", err)
				metrics.Reloaded(false)
				stats.Loaded(*config, nil, true, err)
			}
			return
		}
		s := sha256.Sum256(data)
		if !force {
			if s == sum {
				pending = sum
				return
			}
			if s != pending {
				pending = s
				return
			}
		}
		sum, pending = s, s
		np, err := parsePolicy(*config, data)
		var warnings []string // the file's own, with its lines
		if err == nil {
			warnings = np.Warnings
		}
		if err == nil && rules != nil {
			err = rules.SetConfig(*config, data) // merges the table's rules and installs
			np = rules.Policy()
		}
		stats.Loaded(*config, data, true, err)
		if err != nil {
			log.Error("reload refused, keeping the policy in force", "why", why, "err", err)
			metrics.Reloaded(false)
			return
		}
		warnRestart(log, p.Settings, np.Settings)
		if rules == nil {
			gate.SetPolicy(np)
		}
		metrics.Reloaded(true)
		log.Info("policy reloaded", "why", why, "file", *config, "rules", len(np.Rules))
		logWarnings(log, warnings)
	}
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down")
			shutdown()
			return 0
		case err := <-errc:
			log.Error("server failed", "err", err)
			shutdown()
			return 1
		case <-hup:
			reload("SIGHUP", true)
		case <-tick.C:
			reload("file changed", false)
		}
	}
}

// logWarnings logs the problems of a policy that did not stop it loading.
func logWarnings(log *slog.Logger, warnings []string) {
	for _, w := range warnings {
		log.Warn("policy: " + w)
	}
}

// warnRestart logs the settings a reload cannot change: they are bound
// when serve starts.
func warnRestart(log *slog.Logger, old, new policy.Settings) {
	for _, c := range []struct {
		name     string
		old, new string
	}{
		{"listen", old.Listen, new.Listen},
		{"grpc_listen", old.GRPCListen, new.GRPCListen},
		{"store.url", redact(old.StoreURL), redact(new.StoreURL)},
		{"proxy.listen", old.ProxyListen, new.ProxyListen},
		{"api_listen", old.APIListen, new.APIListen},
		{"server", fmt.Sprintf("%+v", old.Server), fmt.Sprintf("%+v", new.Server)},
		{"proxy.upstream", old.ProxyUpstream, new.ProxyUpstream},
		{"proxy.upstream_timeout", old.ProxyUpstreamTimeout.String(), new.ProxyUpstreamTimeout.String()},
		{"audit_log", old.AuditLog, new.AuditLog},
		{"grpc_tls", tlsFiles(old.GRPCTLS), tlsFiles(new.GRPCTLS)},
	} {
		if c.old != c.new {
			log.Warn("setting changed; it takes effect after a restart", "setting", c.name, "running", c.old, "file", c.new)
		}
	}
}

// tlsFiles names grpc_tls's files, for warnRestart.
func tlsFiles(t *policy.GRPCTLS) string {
	if t == nil {
		return "off"
	}
	return t.CertFile + " " + t.KeyFile + " " + t.ClientCAFile
}

// loopback reports whether a listener's address is reachable only from
// this host.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redact hides the password of a store URL in logs, in its user part or
// its query (pgx reads ?password=); a URL without one is logged as
// written (url.URL.String would turn memory:// into memory:).
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable store url)"
	}
	q, secret := u.Query(), false
	for k := range q {
		if strings.Contains(strings.ToLower(k), "password") {
			q.Set(k, "xxxxx")
			secret = true
		}
	}
	if _, has := u.User.Password(); !has && !secret {
		return raw
	}
	if secret {
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
