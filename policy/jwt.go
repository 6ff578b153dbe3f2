package policy

import "net/http"

// verifier checks bearer tokens and yields their claims.
type verifier struct{}

// claims returns the verified claims of the request's bearer token, or nil.
func (v *verifier) claims(h http.Header) map[string]any { return nil }
