package httpgate

import (
	"cmp"
	"encoding/json"
	"net/http"
)

// QuotaExceededType is the problem type of a rejection, as registered by
// draft-ietf-httpapi-ratelimit-headers in the HTTP Problem Types registry.
const QuotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// Problem is an RFC 9457 problem details body (application/problem+json).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// ViolatedPolicies names the rules that rejected (the draft's
	// extension member of quota-exceeded).
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	// Reason is the X-Sluice-Reason of a rejection.
	Reason string `json:"reason,omitempty"`
	// RetryAfter is the Retry-After of a rejection, in seconds.
	RetryAfter int64 `json:"retry_after,omitempty"`
}

// writeProblem writes p with status, keeping headers already set on w.
func writeProblem(w http.ResponseWriter, p Problem) {
	p.Type = cmp.Or(p.Type, "about:blank")
	p.Title = cmp.Or(p.Title, http.StatusText(p.Status))
	body, err := json.Marshal(p)
	if err != nil { // a Problem always marshals; keep a body anyway
		body = []byte(`{"type":"about:blank","status":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Del("Content-Length")
	w.WriteHeader(p.Status)
	w.Write(append(body, '\n'))
}

// badRequest answers a malformed request with a reason.
func badRequest(w http.ResponseWriter, status int, detail string) {
	writeProblem(w, Problem{Status: status, Detail: detail})
}
