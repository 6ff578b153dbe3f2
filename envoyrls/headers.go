package envoyrls

import (
	"net/http"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// headerValues converts the RateLimit fields of the HTTP API
// (httpgate.RateLimitHeaders, so that a client behind Envoy reads the same
// headers as one talking to sluice directly) into Envoy's form. Envoy adds
// them to OK and OVER_LIMIT responses alike; their order does not matter.
func headerValues(h http.Header) []*corev3.HeaderValue {
	if len(h) == 0 {
		return nil
	}
	n := 0
	for _, vs := range h {
		n += len(vs)
	}
	out := make([]*corev3.HeaderValue, 0, n)
	hv := make([]corev3.HeaderValue, n)
	for k, vs := range h {
		for _, v := range vs {
			p := &hv[len(out)]
			p.Key, p.Value = k, v
			out = append(out, p)
		}
	}
	return out
}
