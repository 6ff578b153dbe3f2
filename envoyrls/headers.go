package envoyrls

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/sluicehq/sluice/policy"
)

// headerRoom is memory for the headers of a response, allocated with it
// (newResponse): its slices have the capacity.
type headerRoom struct {
	ptrs   []*corev3.HeaderValue
	values []corev3.HeaderValue
}

// headerValues converts the RateLimit fields of the HTTP API
// (policy.AppendFields, so that a client behind Envoy reads the
// same headers as one talking to sluice directly) into Envoy's form, in
// room when it has room for them, else with the messages in one
// allocation. Envoy adds them to OK and OVER_LIMIT responses alike.
func headerValues(fs []policy.Field, room headerRoom) []*corev3.HeaderValue {
	if len(fs) == 0 {
		return nil
	}
	out, hv := room.ptrs[:0], room.values[:0]
	if len(fs) > cap(hv) {
		out, hv = make([]*corev3.HeaderValue, 0, len(fs)), make([]corev3.HeaderValue, 0, len(fs))
	}
	out, hv = out[:len(fs)], hv[:len(fs)]
	for i, f := range fs {
		hv[i].Key, hv[i].Value = f.Name, f.Value
		out[i] = &hv[i]
	}
	return out
}
