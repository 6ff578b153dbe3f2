package httpgate

import (
	"cmp"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/sluicehq/sluice/policy"
)

// ForwardAuth serves /v1/auth for nginx auth_request, Traefik ForwardAuth,
// Caddy forward_auth and Envoy's ext_authz (whose calls arrive under
// /v1/auth/, followed by the original path): it applies the rules to the
// original request the proxy describes and answers 200 to let it through,
// or the deny status with the rate limit fields and a quota-exceeded
// problem body. A request whose cost a limit can never grant is answered
// 422 (the deny_status parameter's status when given), without a
// Retry-After.
//
// The original request is read from the headers the front proxy named in
// forward_auth sets, and only when the caller is in trusted_proxies (see
// policy.Policy.FromForwardAuth); otherwise the call is judged as itself.
//
// The deny status is the policy's deny_status (default 429), or the
// deny_status query parameter (a 4xx): nginx's auth_request turns every
// status but 2xx, 401 and 403 into a 500, so nginx asks for 403 and maps it
// back to a 429 (see examples/nginx.conf). Caddy and Envoy pass the
// client's own query string on to sluice, so behind them it is not read:
// a client must not choose how it is refused.
func (g *Gate) ForwardAuth(w http.ResponseWriter, r *http.Request) {
	p := g.Policy()
	status := p.Settings.DenyStatus
	// A request no wait admits is a 422, as the decision API answers it,
	// unless the proxy asked for one status (nginx passes on no other).
	never := http.StatusUnprocessableEntity
	if q := denyStatusParam(r); q != "" && !clientQuery[p.Settings.ForwardAuth.Proxy] {
		n, err := strconv.Atoi(q)
		if err != nil || n < 400 || n > 499 {
			badRequest(w, http.StatusBadRequest, fmt.Sprintf("deny_status %q: want a 4xx status such as 403 or 429", q))
			return
		}
		status, never = n, n
	}
	status = cmp.Or(status, http.StatusTooManyRequests)
	// The call is over when ForwardAuth returns: what it decides with
	// is pooled.
	s := getScratch()
	defer putScratch(s)
	in, err := s.FromForwardAuth(p, r, forwardAuthPath)
	if err != nil {
		badRequest(w, http.StatusBadRequest, err.Error())
		return
	}
	if g.enforce(w, r, p, in, status, never, s) {
		w.Header()["Cache-Control"] = noStore
		w.WriteHeader(http.StatusOK)
	}
}

// scratchPool holds the policy.Scratch of the requests whose decision
// is over when their handler returns (forward auth, the decision API).
var scratchPool = sync.Pool{New: func() any { return new(policy.Scratch) }}

func getScratch() *policy.Scratch { return scratchPool.Get().(*policy.Scratch) }

func putScratch(s *policy.Scratch) {
	s.Clear()
	scratchPool.Put(s)
}

// noStore is the value of Cache-Control on every forward-auth answer,
// shared rather than made per request: net/http only reads it, and its
// capacity of one makes an append copy it.
var noStore = []string{"no-store"}

// clientQuery marks the front proxies whose forward-auth calls carry the
// client's query string.
var clientQuery = map[string]bool{"caddy": true, "envoy": true}

// forwardAuthPath is where forward auth is served; Envoy's ext_authz
// appends the original path to it.
const forwardAuthPath = "/v1/auth"

// denyStatusParam reads the deny_status query parameter.
func denyStatusParam(r *http.Request) string {
	if r.URL == nil || !strings.Contains(r.URL.RawQuery, "deny_status") {
		return ""
	}
	return r.URL.Query().Get("deny_status")
}
