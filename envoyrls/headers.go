package envoyrls

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/sluicehq/sluice/policy"
)

// headerValues converts the RateLimit fields of the HTTP API
// (policy.AppendFields, so that a client behind Envoy reads the
// same headers as one talking to sluice directly) into Envoy's form, the
// messages in one allocation. Envoy adds them to OK and OVER_LIMIT
// responses alike.
func headerValues(fs []policy.Field) []*corev3.HeaderValue {
	if len(fs) == 0 {
		return nil
	}
	out := make([]*corev3.HeaderValue, len(fs))
	hv := make([]corev3.HeaderValue, len(fs))
	for i, f := range fs {
		hv[i].Key, hv[i].Value = f.Name, f.Value
		out[i] = &hv[i]
	}
	return out
}
