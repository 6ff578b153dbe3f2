package httpgate

import (
	"net/http"

	"github.com/sluicehq/sluice/policy"
)

// RateLimitHeaders builds the response fields for a verdict as an
// http.Header: policy.AppendFields, which every request-shaped path (and
// Envoy's response_headers_to_add) sends, so that all of them answer
// alike. identity and path seed the Retry-After jitter (pass
// v.Identity() and the request path); sets picks the header sets
// (Settings.Headers). The status code and body are the caller's to write
// (see WriteRejection).
func RateLimitHeaders(v policy.Verdict, identity, path string, sets []string) http.Header {
	h := make(http.Header, 8)
	setRateLimitHeaders(h, &v, identity, path, sets)
	return h
}

// setRateLimitHeaders is RateLimitHeaders writing into h. The field names
// are canonical already, so they are set without canonicalizing anew.
func setRateLimitHeaders(h http.Header, v *policy.Verdict, identity, path string, sets []string) {
	var buf [policy.MaxFields]policy.Field
	fs := policy.AppendFields(buf[:0], v, identity, path, sets)
	// One backing array for every value.
	vals := make([]string, len(fs))
	for i, f := range fs {
		vals[i] = f.Value
		h[f.Name] = vals[i : i+1 : i+1]
	}
}
