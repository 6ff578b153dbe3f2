package main

import (
	"context"
	"errors"
	"flag"
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
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/internal/gcgoal"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/serverconf"
)

func init() {
	commands["serve"] = command{"serve the decision API, forward auth, proxy and metrics", func(args []string, _, stderr io.Writer) int {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		defer stop()
		return serve(ctx, args, stderr, nil)
	}}
}

// server is what serve has built, for the listeners it starts.
type server struct {
	// Gate holds the policy in force (Gate.Policy, replaced on reload) and
	// decides requests (Gate.Check).
	Gate    *httpgate.Gate
	Limiter *sluice.Limiter
	Metrics *metrics.Metrics
	// Stats feeds the live page (/ui, /v1/stats).
	Stats  *insight.Collector
	Logger *slog.Logger
	// Leases leases the policy's leased rules (package quota).
	Leases *leasing
}

// reloadPoll is how often serve checks the config file for changes.
var reloadPoll = time.Second

// listening reports the addresses serve listens on, for tests.
type listening struct {
	API, Proxy, GRPC string
	// Decision is api_listen's address, when the decision API has a
	// listener of its own.
	Decision string
}

// serveFlags are serve's command line.
type serveFlags struct {
	config, listen, proxyListen, apiListen, grpcListen, cpuProfile string
	// shutdownDrain overrides server.shutdown_drain when drainSet.
	shutdownDrain time.Duration
	drainSet      bool
}

// serve runs until ctx is done; ready, when not nil, is called once the
// listeners accept connections.
func serve(ctx context.Context, args []string, stderr io.Writer, ready func(listening)) int {
	f, code, ok := parseServeFlags(args, stderr)
	if !ok {
		return code
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sluice serve: %v\n", err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	stopProfile, err := startCPUProfile(f.cpuProfile)
	if err != nil {
		return fail(err)
	}
	defer stopProfile()
	// The collector waits for a heap of gcgoal.ServeFloor while the live
	// heap is small; GOGC in the environment turns this off.
	defer gcgoal.Start(gcgoal.ServeFloor, time.Second)()

	file, p, err := loadPolicy(f.config)
	if err != nil {
		return fail(err)
	}
	xc, xp, fromEnv, err := xdsClient(f.config, file.Server(), p, os.Getenv, log)
	if err != nil {
		return fail(err)
	}
	if xc != nil {
		// The control plane is the source; the file (or the reference's
		// environment) gave the settings.
		file, p = &configFile{server: fromEnv}, xp
	}
	started := fileSettings(file.Server(), p)
	rs := withFlags(started, f)
	if err := preflight(p.Source, rs); err != nil {
		return fail(err)
	}
	reg := newRegistry()
	store, closeStore, err := connectStore(ctx, rs.StoreURL, reg, log)
	if err != nil {
		return fail(err)
	}
	defer closeStore()
	src, p, closeSource, err := policySource(ctx, file.File, p, rs, store)
	if err == nil {
		err = supported(store, p)
	}
	if err != nil {
		return fail(err)
	}
	defer closeSource()
	if xc != nil {
		src, rs.ready, rs.healthy = xc, xc.Ready, xc.Healthy
		defer runXDS(ctx, xc, reg, log)()
	}
	if src != nil {
		src = supportedSource{src, store}
	}
	logWarnings(log, p.Warnings)
	srv, closeServer, err := newServer(p, rs, store, reg, log)
	if err != nil {
		return fail(err)
	}
	defer closeServer()
	srv.Stats.Loaded(p.Source, fileContent(f.config), false, nil)

	lns, err := bind(rs)
	if err != nil {
		return fail(err)
	}
	errc := make(chan error, len(lns))
	addrs, shutdown := startHTTP(srv, rs, lns, errc)
	if ln := lns["envoy-rls"]; ln != nil {
		var stop func()
		addrs.GRPC, stop = startEnvoy(srv, rs, ln)
		defer stop()
	}
	defer watchPolicy(ctx, src, srv, started, file)()
	// The live page's statistics, published to the fleet on a shared store.
	fleetCtx, stopFleet := context.WithCancel(ctx)
	fleetDone := make(chan struct{})
	go func() { defer close(fleetDone); srv.Gate.RunFleet(fleetCtx) }()
	defer func() { stopFleet(); <-fleetDone }()
	if ready != nil {
		ready(addrs)
	}
	return waitForShutdown(ctx, log, errc, rs.Server.ShutdownDrain, shutdown)
}

// parseServeFlags reads serve's command line; when ok is false serve is
// over and exits with code.
func parseServeFlags(args []string, stderr io.Writer) (f serveFlags, code int, ok bool) {
	fs := newFlagSet("serve", "usage: sluice serve [--config FILE] [--listen ADDR] [--proxy-listen ADDR] [--grpc-listen ADDR|off]\n\nWithout --config, serves the embedded default policy: per client IP, 10\nrequests per second, burst 20, memory store. The flags override the policy's\naddresses. SIGHUP, or a change to the file, reloads the policy (an invalid\none is refused and the old one keeps serving); SIGTERM or SIGINT fails\n/readyz for server.shutdown_drain while it still serves, then stops accepting\nconnections and lets the requests in flight finish.", stderr)
	fs.StringVar(&f.config, "config", "", "policy file (YAML or JSON); default: the embedded per-IP policy")
	fs.StringVar(&f.listen, "listen", "", "forward auth address, and the decision API's unless api_listen is set (overrides the policy's listen)")
	fs.StringVar(&f.proxyListen, "proxy-listen", "", "reverse proxy address (overrides proxy.listen)")
	fs.StringVar(&f.apiListen, "api-listen", "", "decision API address, apart from forward auth (overrides api_listen)")
	fs.StringVar(&f.grpcListen, "grpc-listen", "", "Envoy rate limit service address (overrides grpc_listen; \"off\" disables it)")
	fs.DurationVar(&f.shutdownDrain, "shutdown-drain", 0, "how long /readyz answers 503 before the listeners close on SIGTERM (overrides server.shutdown_drain; 0: none)")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (at shutdown), for go tool pprof")
	if code, ok := parseFlags(fs, args, false); !ok {
		return f, code, false
	}
	fs.Visit(func(fl *flag.Flag) { f.drainSet = f.drainSet || fl.Name == "shutdown-drain" })
	if f.shutdownDrain < 0 || f.shutdownDrain > serverconf.MaxShutdownDrain {
		fmt.Fprintf(stderr, "sluice serve: --shutdown-drain %v: must be between 0s (no drain) and %v\n", f.shutdownDrain, serverconf.MaxShutdownDrain)
		return f, 2, false
	}
	return f, 0, true
}

// startCPUProfile profiles the whole run into path ("": none); the
// returned function writes the profile.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// configFile is the config file at a path as a policy.Source, in sluice's
// format or envoyproxy/ratelimit's (whose store and gRPC address come
// from the reference server's environment variables; see
// envoyrls.Parser). It keeps the server's settings of the version it
// last parsed, which are no part of a policy: serve reads them when it
// starts, and at each reload to warn of what only a restart changes.
type configFile struct {
	// File is nil for the embedded default, which has no file.
	*policy.File

	mu     sync.Mutex
	server serverconf.Settings
}

// newConfigFile is the config file at path.
func newConfigFile(path string) *configFile {
	c := &configFile{}
	parse := envoyrls.Parser(os.Getenv)
	c.File = &policy.File{Path: path, Poll: reloadPoll, Parse: func(name string, data []byte) (*policy.Policy, error) {
		p, srv, err := parse(name, data)
		if err == nil {
			c.mu.Lock()
			c.server = srv
			c.mu.Unlock()
		}
		return p, err
	}}
	return c
}

// Server returns the server's settings of the version last parsed.
func (c *configFile) Server() serverconf.Settings {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.server
}

// loadPolicy reads the config file at path, in either format (see
// configFile), and returns it with its policy; with no path, the embedded
// default policy and settings, and a configFile with no File.
func loadPolicy(path string) (*configFile, *policy.Policy, error) {
	if path == "" {
		p, srv, err := policy.ParseConfig("embedded default", []byte(policy.DefaultYAML))
		if err != nil {
			return nil, nil, err
		}
		return &configFile{server: srv}, p, nil
	}
	file := newConfigFile(path)
	p, err := file.Load(context.Background(), true)
	if err != nil {
		return nil, nil, err
	}
	return file, p, nil
}

// policySource returns where serve's policy comes from and the policy to
// start with: the config file merged with PostgreSQL's rules table when
// the store keeps rules there, else the file alone (nil with no file:
// the embedded default never changes).
func policySource(ctx context.Context, file *policy.File, p *policy.Policy, rs runSettings, store sluice.Store) (policy.Source, *policy.Policy, func(), error) {
	rules, merged, err := rulesSource(ctx, rs.StoreURL, store, file)
	switch {
	case err != nil:
		return nil, nil, nil, err
	case rules != nil:
		return rules, merged, rules.Close, nil
	case file == nil:
		return nil, p, func() {}, nil
	}
	return file, p, func() {}, nil
}

// newRegistry is the registry /metrics serves: the Go runtime's and the
// process's collectors; the store and the server add theirs.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// newServer builds what the listeners serve: the metrics, the limiter on
// the store, the audit log and the gate enforcing p.
func newServer(p *policy.Policy, rs runSettings, store sluice.Store, reg *prometheus.Registry, log *slog.Logger) (*server, func(), error) {
	m := metrics.New(reg)
	m.WatchKeys(store)
	// The live page's statistics, fed by every decision and store call.
	stats := insight.New(insight.Options{Store: redact(rs.StoreURL), Readings: m.Values})
	m.OnStoreCall(stats.StoreCall)
	var audit *httpgate.Audit
	closeAudit := func() {}
	if rs.pol.AuditLog != "" {
		f, err := os.OpenFile(rs.pol.AuditLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			return nil, nil, fmt.Errorf("audit log: %w", err)
		}
		closeAudit = func() { f.Close() }
		audit = httpgate.NewAudit(f)
	}
	// Leased quotas wrap the instrumented store: its metrics count the
	// calls that reach the store, slices included.
	inst := m.InstrumentStore(store)
	leases := newLeasing(rs.StoreURL, inst, log)
	leases.configure(p)
	if leases.q != nil {
		m.WatchLeases(leases.q)
	}
	lim := sluice.New(leases.store(inst))
	closeAll := func() { leases.close(); closeAudit() }
	limits := rs.Server.WithDefaults()
	gate := httpgate.New(p, lim, httpgate.Options{Ready: rs.ready, Healthy: rs.healthy, Metrics: m, Audit: audit, Logger: log, Delay: httpgate.ReserveDelay(limits.WriteTimeout), Insight: stats})
	// The deadline of /readyz's own probe.
	m.WatchReady(gate.Ready, time.Second)
	return &server{Gate: gate, Limiter: lim, Metrics: m, Stats: stats, Logger: log, Leases: leases}, closeAll, nil
}

// startHTTP serves the HTTP listeners of lns (bound by bind): forward
// auth and the decision API, and the proxy. Each has the server section's
// deadlines and a cap on its connections; one that fails reports on errc.
// shutdown fails /readyz and, for drain, keeps serving (without
// keep-alive, so that clients reconnect to where the load balancer now
// sends them), then stops accepting and closes the listeners once their
// requests end (shutdownGrace at most).
func startHTTP(s *server, rs runSettings, lns map[string]net.Listener, errc chan<- error) (addrs listening, shutdown func(drain time.Duration)) {
	gate, log := s.Gate, s.Logger
	limits := rs.Server.WithDefaults()
	handlers := map[string]http.Handler{"api": gate.Handler()}
	if rs.APIListen != "" {
		handlers = map[string]http.Handler{"auth": gate.AuthHandler(), "api": gate.APIHandler()}
	}
	if rs.ProxyUpstream != "" {
		up, _ := url.Parse(rs.ProxyUpstream) // checked when the policy loaded
		handlers["proxy"] = gate.Proxy(up, httpgate.ProxyOptions{ResponseHeaderTimeout: rs.ProxyUpstreamTimeout})
	}
	nofile := openFileLimit()
	conns := maxConns(limits.MaxConns, nofile, len(handlers))
	if nofile > 0 && uint64(conns*len(handlers)) > nofile {
		log.Warn("server.max_conns exceeds the open file limit: slow clients can exhaust file descriptors before the cap stops them", "max_conns", conns, "listeners", len(handlers), "open_file_limit", nofile)
	}
	perClient := limits.ConnsPerClient(conns)
	var servers []*http.Server
	addr := map[string]string{}
	for _, l := range rs.listeners() {
		h, ok := handlers[l.name]
		if !ok {
			continue
		}
		mk := httpgate.APIServer
		if l.name == "proxy" {
			mk = proxyServer
		}
		lc := httpgate.LimitConns(lns[l.name], conns)
		lc.PerClient(perClient, func(a net.Addr) string { return gate.Policy().ConnClient(a) })
		hs := mk(h, limits, lc)
		servers = append(servers, hs)
		go func(name string) {
			if err := hs.Serve(lc); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}(l.name)
		addr[l.name] = lc.Addr().String()
		log.Info("listening", "server", l.name, "addr", addr[l.name], "policy", gate.Policy().Source, "store", redact(rs.StoreURL), "max_conns", conns)
	}
	addrs = listening{API: addr["api"], Decision: addr["api"], Proxy: addr["proxy"]}
	if rs.APIListen != "" {
		addrs.API = addr["auth"]
	}
	if rs.pol.APITokenEnv == "" && !loopback(addrs.Decision) {
		log.Warn("the decision API is open to anyone who reaches it: /v1/take can drain any bucket; set api_token_env, or api_listen on a private address", "addr", addrs.Decision)
	}
	return addrs, func(drain time.Duration) {
		gate.Drain()
		if drain > 0 {
			for _, hs := range servers {
				hs.SetKeepAlivesEnabled(false)
			}
			// A second SIGTERM or SIGINT ends the drain: whoever sends it
			// is not waiting for a load balancer.
			again := make(chan os.Signal, 1)
			signal.Notify(again, syscall.SIGTERM, os.Interrupt)
			log.Info("draining: /readyz answers 503 while requests are still served", "for", drain)
			t := time.NewTimer(drain)
			select {
			case <-t.C:
			case <-again:
				t.Stop()
				log.Info("drain cut short by a second signal")
			}
			signal.Stop(again)
		}
		log.Info("closing the listeners", "grace", shutdownGrace)
		ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		for _, hs := range servers {
			hs.Shutdown(ctx)
		}
	}
}

// watchPolicy reloads the policy of src into the gate on SIGHUP and
// whenever src changes (policy.Watch), logging and counting every reload,
// until ctx is done; the returned function stops it. Without a source
// (the embedded default) SIGHUP is taken and ignored.
func watchPolicy(ctx context.Context, src policy.Source, s *server, started runSettings, cf *configFile) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	if src == nil {
		return func() { signal.Stop(hup) }
	}
	file := "" // an xDS control plane's policies have no file
	if cf.File != nil {
		file = cf.File.Path
	}
	ctx, cancel := context.WithCancel(ctx)
	now := make(chan string)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			select {
			case <-ctx.Done():
				return
			case now <- "SIGHUP":
			}
		}
	}()
	go func() {
		defer wg.Done()
		install := func(p *policy.Policy) {
			s.Gate.SetPolicy(p)
			s.Leases.configure(p)
		}
		policy.Watch(ctx, src, now, install, func(r policy.Reload) {
			if r.Unchanged {
				// Not a reload: nothing is installed, counted or shown.
				s.Logger.Info("policy unchanged, nothing to reload", "why", r.Why, "file", file)
				return
			}
			s.Stats.Loaded(file, fileContent(file), true, r.Err)
			if r.Err != nil {
				s.Logger.Error("reload refused, keeping the policy in force", "why", r.Why, "err", r.Err)
				s.Metrics.Reloaded(false)
				return
			}
			warnRestart(s.Logger, started, fileSettings(cf.Server(), r.Policy))
			s.Metrics.Reloaded(true)
			s.Logger.Info("policy reloaded", "why", r.Why, "file", file, "rules", len(r.Policy.Rules))
			logWarnings(s.Logger, r.Policy.Warnings)
		})
	}()
	return func() {
		cancel()
		wg.Wait()
		signal.Stop(hup)
	}
}

// fileContent is the policy file's content for the live page's version of
// it; nil for the embedded default or a file that cannot be read now.
func fileContent(path string) []byte {
	if path == "" {
		return nil
	}
	data, _ := os.ReadFile(path)
	return data
}

// shutdownGrace bounds how long the requests in flight at shutdown have
// to finish once the listeners stop accepting.
const shutdownGrace = 10 * time.Second

// waitForShutdown serves until ctx is done (exit 0) or a listener fails
// (exit 1), then shuts the listeners down: told to stop, after drain
// with /readyz failing, so that a load balancer polling it stops sending
// new connections before they are refused; after a failure at once.
func waitForShutdown(ctx context.Context, log *slog.Logger, errc <-chan error, drain time.Duration, shutdown func(time.Duration)) int {
	select {
	case <-ctx.Done():
		log.Info("shutting down", "drain", drain)
		shutdown(drain)
		return 0
	case err := <-errc:
		log.Error("server failed", "err", err)
		shutdown(0)
		return 1
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
func warnRestart(log *slog.Logger, old, new runSettings) {
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
		{"audit_log", old.pol.AuditLog, new.pol.AuditLog},
		{"grpc_tls", tlsFiles(old.GRPCTLS), tlsFiles(new.GRPCTLS)},
		{"grpc", fmt.Sprintf("%+v", old.GRPC), fmt.Sprintf("%+v", new.GRPC)},
	} {
		if c.old != c.new {
			log.Warn("setting changed; it takes effect after a restart", "setting", c.name, "running", c.old, "file", c.new)
		}
	}
}

// tlsFiles names grpc_tls's files, for warnRestart.
func tlsFiles(t *serverconf.GRPCTLS) string {
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
