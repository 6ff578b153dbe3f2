package bench

import (
	"context"
	"io"
	"net/http"
	"strconv"

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

// BareHandler answers GET /v1/auth with 200 and POST /v1/take with an
// admitting decision, with the header fields sluice sends for the same
// answers under the front-door policy, and decides nothing.
func BareHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/auth", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("RateLimit-Policy", `"per-user";q=1000000000;w=1`)
		h.Set("RateLimit", `"per-user";r=999999999;t=0`)
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("/v1/take", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		io.WriteString(w, `{"allowed":true,"limit":1000000000,"remaining":999999999,"reset_after_ms":0,"retry_after_ms":0}`+"\n")
	})
	return mux
}

// NoopRLS answers every call OK: the floor of the gRPC stack.
type NoopRLS struct {
	rlspb.UnimplementedRateLimitServiceServer
}

// ShouldRateLimit answers OK for every descriptor.
func (NoopRLS) ShouldRateLimit(_ context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	st := make([]*rlspb.RateLimitResponse_DescriptorStatus, len(req.Descriptors))
	for i := range st {
		st[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
	}
	return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: st}, nil
}
