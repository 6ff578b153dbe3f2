package xds

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/policy"
)

// TypeURL is the resource type the client subscribes to: the reference
// server's configuration, one RateLimitConfig per domain.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Client follows a control plane's RateLimitConfig snapshots. Each one
// that compiles (envoyrls.ParseReferenceResources) is acknowledged and
// becomes the policy Load returns; one that does not is refused (NACK,
// with the reason) and the last good policy keeps serving whole. It is a
// policy.Source: sluice serve installs its policies as it installs a
// reloaded file's. Run connects and follows until its context ends.
type Client struct {
	cfg      Config
	source   string
	settings policy.Settings
	log      *slog.Logger
	// parse compiles a snapshot (envoyrls.ParseReferenceResources).
	parse func(source string, cfgs []*rlsconf.RateLimitConfig) (*policy.Policy, error)

	mu      sync.Mutex
	pending *policy.Policy // applied, not yet taken by Load
	// taken: Load has handed out an applied snapshot, which sluice serve
	// installs as it returns. Ready waits for it: Applied alone said
	// ready while the watcher had yet to take the snapshot, and a call
	// let in then was decided by the empty policy of the start.
	taken   bool
	changed func(why string)
	st      Status
	applied [32]byte // the applied snapshot's content
}

// Status is where the client stands, for /readyz, logs and metrics.
type Status struct {
	// Connected: a stream to the control plane is open.
	Connected bool
	// Applied: a snapshot was applied since start; Version is the
	// applied one's (the last good, not the last received).
	Applied bool
	Version string
	// Updates and Rejected count the snapshots applied and refused
	// (each refused snapshot once, however often it is resent);
	// Reconnects the streams that ended.
	Updates, Rejected, Reconnects uint64
	// LastError is why the last snapshot was refused or the last stream
	// ended ("" when none).
	LastError string
}

// New returns a client for cfg (with its defaults) whose policies carry
// settings (the file's or the environment's: the listeners and the store
// are bound at start and a snapshot cannot change them).
func New(cfg Config, settings policy.Settings, log *slog.Logger) *Client {
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	cfg = cfg.WithDefaults()
	parse := func(source string, cfgs []*rlsconf.RateLimitConfig) (*policy.Policy, error) {
		p, err := envoyrls.ParseReferenceResources(source, cfgs)
		if err == nil {
			cfg.Modes.Apply(p)
		}
		return p, err
	}
	return &Client{cfg: cfg, source: "xds://" + cfg.Server, settings: settings, log: log, parse: parse}
}

// Initial is the policy to serve before the first snapshot: the
// reference format with no domain, which limits nothing (the reference
// server's answer for a domain it does not know), with the client's
// settings.
func (c *Client) Initial() (*policy.Policy, error) {
	p, err := c.parse(c.source, nil)
	if err != nil {
		return nil, err
	}
	p.Settings = c.settings
	return p, nil
}

// Source names the client's policies: "xds://SERVER", "@VERSION" after
// it for a snapshot's.
func (c *Client) Source() string { return c.source }

// Status returns where the client stands.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

// Ready says why /readyz should fail, nil when it should not: before the
// first snapshot is applied and taken by Load (sluice serve installs it
// as Load returns it), and, with UnreadyWhenLost, while no stream is
// open.
func (c *Client) Ready() error {
	c.mu.Lock()
	st, taken := c.st, c.taken
	c.mu.Unlock()
	switch {
	case !st.Applied || !taken:
		return fmt.Errorf("no rate limit configuration from the control plane %s yet", c.cfg.Server)
	case c.cfg.UnreadyWhenLost && !st.Connected:
		return fmt.Errorf("control plane %s lost (serving version %q)", c.cfg.Server, st.Version)
	}
	return nil
}

// Healthy is what the reference's /healthcheck asks: nil, or, with
// HealthyOnceApplied, an error until a first snapshot is applied.
func (c *Client) Healthy() error {
	if c.cfg.HealthyOnceApplied && !c.Status().Applied {
		return fmt.Errorf("no rate limit configuration from the control plane %s yet", c.cfg.Server)
	}
	return nil
}

// Load implements policy.Source: the snapshot applied since the last
// Load, else nil (a forced load has nothing to reread: the control plane
// pushes).
func (c *Client) Load(context.Context, bool) (*policy.Policy, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pending
	c.pending = nil
	c.taken = c.taken || p != nil
	return p, nil
}

// Watch implements policy.Source: changed is called when a snapshot is
// applied, until ctx is done.
func (c *Client) Watch(ctx context.Context, changed func(why string)) {
	c.mu.Lock()
	c.changed = changed
	pending := c.pending != nil
	c.mu.Unlock()
	if pending {
		changed("xds snapshot")
	}
	<-ctx.Done()
	c.mu.Lock()
	c.changed = nil
	c.mu.Unlock()
}

// Run follows the control plane until ctx is done: one ADS stream at a
// time, a new one after each ends, paced by Config.Backoff (reset by a
// stream that brought a response).
func (c *Client) Run(ctx context.Context) error {
	tc, err := c.cfg.TLSConfig()
	if err != nil {
		return err
	}
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	bc := backoff.DefaultConfig
	bc.BaseDelay, bc.MaxDelay = c.cfg.ConnectRetryInterval, max(c.cfg.ConnectRetryInterval, c.cfg.Backoff.Max)
	conn, err := grpc.NewClient(c.cfg.Server,
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: c.cfg.ConnectRetryInterval}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.cfg.MaxRecvBytes)))
	if err != nil {
		return fmt.Errorf("xds: server %q: %w", c.cfg.Server, err)
	}
	defer conn.Close()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	if len(c.cfg.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(c.cfg.Headers))
	}
	attempt := 0
	for {
		got, err := c.stream(ctx, ads)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			attempt = 0
		}
		wait := c.backoff(attempt, rand.Float64())
		attempt++
		c.mu.Lock()
		c.st.Connected = false
		c.st.Reconnects++
		c.st.LastError = err.Error()
		version := c.st.Version
		c.mu.Unlock()
		c.log.Warn("xds: control plane lost, the last applied configuration keeps serving", "server", c.cfg.Server, "err", err, "version", version, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// backoff is the wait before stream attempt+1 (attempt 0: the first
// retry), for a uniform draw u in [0,1): Initial doubled attempt times,
// at most Max, then, with Jitter, scaled into [1-RandomFactor, 1] of
// itself, so that a fleet that lost its control plane together does not
// come back together.
func (c *Client) backoff(attempt int, u float64) time.Duration {
	b := c.cfg.Backoff
	d := b.Initial
	for i := 0; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if b.Jitter && b.RandomFactor > 0 {
		d -= time.Duration(float64(d) * b.RandomFactor * u)
	}
	return max(d, time.Millisecond)
}

// stream runs one ADS stream; got reports whether a response came.
func (c *Client) stream(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("open stream: %w", err)
	}
	node := &core.Node{Id: c.cfg.NodeID, UserAgentName: "sluice"}
	if len(c.cfg.NodeMetadata) > 0 {
		f := map[string]*structpb.Value{}
		for k, v := range c.cfg.NodeMetadata {
			f[k] = structpb.NewStringValue(v)
		}
		node.Metadata = &structpb.Struct{Fields: f}
	}
	c.mu.Lock()
	version := c.st.Version
	c.mu.Unlock()
	// The first request names the applied version: a control plane
	// that restarted resends what it has unless this is it, and one that
	// this client refused is sent again.
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: version}); err != nil {
		return false, fmt.Errorf("send: %w", err)
	}
	var refused [32]byte
	var refusedMsg string
	repeat := 0
	for {
		resp, err := s.Recv()
		if err != nil {
			return got, fmt.Errorf("receive: %w", err)
		}
		if !got {
			got = true
			c.mu.Lock()
			c.st.Connected = true
			c.mu.Unlock()
			c.log.Info("xds: connected to the control plane", "server", c.cfg.Server, "node_id", c.cfg.NodeID)
		}
		if resp.GetTypeUrl() != TypeURL {
			// Not subscribed to: an ADS server may push other types
			// on the same stream; refuse without touching the policy.
			if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(),
				ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "sluice subscribes to " + TypeURL + " only"}}); err != nil {
				return got, fmt.Errorf("send: %w", err)
			}
			continue
		}
		sum := snapshotSum(resp)
		msg, applied := c.apply(resp, sum)
		req := &discovery.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		c.mu.Lock()
		req.VersionInfo = c.st.Version
		c.mu.Unlock()
		if !applied {
			req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: msg}
			if sum == refused && msg == refusedMsg {
				// The same refused snapshot again (a control plane
				// answers a NACK by resending what it has): answer it
				// after a wait that grows, so that the pair does not
				// spin; it was logged and counted once.
				repeat++
				t := time.NewTimer(c.backoff(repeat-1, rand.Float64()))
				select {
				case <-ctx.Done():
					t.Stop()
					return got, ctx.Err()
				case <-t.C:
				}
			} else {
				refused, refusedMsg, repeat = sum, msg, 0
			}
		} else {
			refused, refusedMsg, repeat = [32]byte{}, "", 0
		}
		if err := s.Send(req); err != nil {
			return got, fmt.Errorf("send: %w", err)
		}
	}
}

// snapshotSum identifies a response's content (its resources, whatever
// their order), so that a resend is known for one.
func snapshotSum(resp *discovery.DiscoveryResponse) [32]byte {
	sums := make([][32]byte, 0, len(resp.GetResources()))
	for _, r := range resp.GetResources() {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		sums = append(sums, sha256.Sum256(b))
	}
	// Order-free: sum the sorted sums.
	slices.SortFunc(sums, func(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, s := range sums {
		h.Write(s[:])
	}
	return [32]byte(h.Sum(nil))
}

// apply compiles resp and, when it compiles, makes it the pending policy;
// else msg says why it is refused. A response whose content is the
// applied one's only moves the version.
func (c *Client) apply(resp *discovery.DiscoveryResponse, sum [32]byte) (msg string, ok bool) {
	c.mu.Lock()
	same := c.st.Applied && sum == c.applied
	lastErr := c.st.LastError
	c.mu.Unlock()
	if same {
		c.mu.Lock()
		c.st.Version = resp.GetVersionInfo()
		c.mu.Unlock()
		return "", true
	}
	cfgs := make([]*rlsconf.RateLimitConfig, 0, len(resp.GetResources()))
	var err error
	for i, r := range resp.GetResources() {
		rc := &rlsconf.RateLimitConfig{}
		if r.GetTypeUrl() != TypeURL {
			err = fmt.Errorf("resource #%d is a %s, not a RateLimitConfig", i, r.GetTypeUrl())
			break
		}
		if e := r.UnmarshalTo(rc); e != nil {
			err = fmt.Errorf("resource #%d: %w", i, e)
			break
		}
		cfgs = append(cfgs, rc)
	}
	var p *policy.Policy
	if err == nil {
		p, err = c.parse(c.source+"@"+resp.GetVersionInfo(), cfgs)
	}
	if err != nil {
		msg = err.Error()
		c.mu.Lock()
		st := &c.st
		st.LastError = msg
		if msg != lastErr {
			st.Rejected++
		}
		version := st.Version
		c.mu.Unlock()
		if msg != lastErr {
			c.log.Error("xds: snapshot refused (NACK), the last applied configuration keeps serving", "version", resp.GetVersionInfo(), "serving", version, "err", msg)
		}
		return msg, false
	}
	p.Settings = c.settings
	c.mu.Lock()
	c.pending = p
	c.applied = sum
	c.st.Applied = true
	c.st.Version = resp.GetVersionInfo()
	c.st.Updates++
	c.st.LastError = ""
	changed := c.changed
	c.mu.Unlock()
	c.log.Info("xds: snapshot applied", "version", resp.GetVersionInfo(), "resources", len(cfgs))
	if changed != nil {
		changed("xds snapshot " + resp.GetVersionInfo())
	}
	return "", true
}
