package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/serverconf"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The floors that sluice's front doors are measured against (by
// BenchmarkFrontDoor in one process and by cmd/frontdoor in processes of
// their own): what a server on the same stack does when it decides
// nothing and answers what sluice answers.

// Users are the 10,000 user values the front-door loads spread over.
func Users() []string {
	users := make([]string, 10_000)
	for i := range users {
		users[i] = "user-" + strconv.Itoa(i)
	}
	return users
}

// BareAuth answers forward auth (GET /v1/auth) as the gate answers an
// admitted call of the front-door policy, the draft's and the trio's
// fields and Cache-Control, and decides nothing.
func BareAuth(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("RateLimit-Policy", `"per-user";q=1000000000;w=1`)
	h.Set("RateLimit", `"per-user";r=999999999;t=1`)
	h.Set("RateLimit-Limit", "1000000000")
	h.Set("RateLimit-Remaining", "999999999")
	h.Set("RateLimit-Reset", "1")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
}

// BareTake answers POST /v1/take with the gate's answer to a take of the
// front-door policy, its fields and its length, and decides nothing.
func BareTake(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	io.WriteString(w, `{"allowed":true,"limit":1000000000,"remaining":999999999,"tokens":999999999,"retry_after_ms":0,"reset_after_ms":1,"rule":"per-user","reason":""}`+"\n")
}

// BareServer serves h with the deadlines and bounds that sluice serve
// gives its own servers (httpgate.APIServer's), and nothing else: no cap
// on connections, no mark on their contexts.
func BareServer(h http.Handler) *http.Server {
	srv := httpgate.APIServer(h, serverconf.DefaultServerLimits, nil)
	srv.ConnState, srv.ConnContext = nil, nil
	return srv
}

// BareProxy is the floor of sluice's reverse proxy door: a Go reverse
// proxy to upstream that decides nothing, with the transport settings and
// the forwarding headers of sluice's own (httpgate's proxy), so that the
// difference is the door's work, not the connection pooling's.
func BareProxy(upstream *url.URL) http.Handler {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
		},
		Transport:     tr,
		FlushInterval: -1,
	}
}

// GRPCPolicy is the front-door policy of the Envoy rate limit service:
// one rule per descriptor value that never refuses, so that sluice and
// the no-op both answer OK (testdata/frontdoor-grpc.yaml says the same
// for sluice serve).
const GRPCPolicy = "rules:\n  - name: per-user\n    match: {domain: bench}\n    limit_keys: [\"descriptor:user\"]\n    algorithm: token_bucket\n    algorithm_config: {rps: 1000000000, burst: 1000000000}\n"

// NoopRLS answers every call OK, deciding nothing: the floor of the gRPC
// stack. Every descriptor's status is Status, and the headers are
// Headers: what sluice answers (NoopLikeSluice), so that a client decodes
// the same bytes from both.
type NoopRLS struct {
	rlspb.UnimplementedRateLimitServiceServer
	Status  *rlspb.RateLimitResponse_DescriptorStatus
	Headers []*corev3.HeaderValue
}

// ShouldRateLimit answers OK for every descriptor.
func (n NoopRLS) ShouldRateLimit(_ context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	st := make([]*rlspb.RateLimitResponse_DescriptorStatus, len(req.Descriptors))
	for i := range st {
		st[i] = n.Status
	}
	return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: st, ResponseHeadersToAdd: n.Headers}, nil
}

// NoopLikeSluice is the no-op answering what srv, sluice's service under
// GRPCPolicy, answers to a first call.
func NoopLikeSluice(srv rlspb.RateLimitServiceServer) (NoopRLS, error) {
	first, err := srv.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "first"}},
	}}})
	if err != nil {
		return NoopRLS{}, err
	}
	return NoopRLS{Status: first.Statuses[0], Headers: first.ResponseHeadersToAdd}, nil
}

// Drive runs conns workers of call (worker w, sequence number i) for d,
// and returns the calls made and the first error, which stops them all.
// With perSecond above 0 the workers together start at most perSecond
// calls a second (an open loop, the same offered load on both sides of a
// comparison, so that a server's CPU per call is not moved by how
// saturated it runs); with 0 each calls again as soon as it is answered.
func Drive(call func(w, i int) error, conns int, d time.Duration, perSecond float64) (int64, error) {
	var n atomic.Int64
	var stop atomic.Bool
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var pace *rate.Limiter
	if perSecond > 0 {
		pace = rate.NewLimiter(rate.Limit(perSecond), conns)
	}
	for w := range conns {
		wg.Go(func() {
			i := w * 7919
			var k int64
			for !stop.Load() {
				if pace != nil && pace.Wait(ctx) != nil {
					break
				}
				if err := call(w, i); err != nil {
					first.CompareAndSwap(nil, &err)
					stop.Store(true)
					break
				}
				i += 7
				k++
			}
			n.Add(k)
		})
	}
	<-ctx.Done()
	stop.Store(true)
	wg.Wait()
	if err := first.Load(); err != nil {
		return n.Load(), *err
	}
	return n.Load(), nil
}
