// Package httpgate puts sluice's policies in front of HTTP traffic: the JSON
// decision API (/v1/take, /v1/peek, /v1/reset, /v1/settle), forward auth for nginx
// auth_request, Traefik ForwardAuth, Caddy forward_auth and Envoy ext_authz
// (/v1/auth), a reverse proxy, a Go middleware, the /metrics endpoint of a
// metrics.Metrics, an audit log of rejections, and the live page of an
// insight.Collector (/ui, its data at /v1/stats; ui.go, stats.go).
//
// LimitByIP, LimitByHeader and LimitGlobal are the middleware for the
// common cases, n requests per period, without a configuration file:
//
//	http.ListenAndServe(":8080", httpgate.LimitByIP(100, time.Minute)(app))
//
// Every request-shaped path (forward auth, proxy, middleware) answers the
// same way: policy.Match builds each applicable rule's key, policy.Enforce
// decides all of them at once, and RateLimitHeaders writes what
// policy.AppendFields says the client is told as http.Header. A rejection
// is a 429 (or the configured deny status) with an
// application/problem+json body of type quota-exceeded (WriteRejection),
// whose detail and violated limits are the verdict's
// (policy.Verdict.Violations). The Envoy service (package envoyrls) tells
// its callers the same from the same functions.
//
// The proxy and the middleware also settle the limits whose rules set
// settle_from, at the actual cost the response states (package settle
// reads it; settle.go), and measure the upstream for adaptive rates
// (package adaptive; adaptive.go); the decision API settles through the
// signed handles of /v1/settle (settleapi.go).
//
// APIServer, LimitConns and ReserveDelay serve forward auth and the
// decision API as sluice serve does: its deadlines, its cap on
// connections, and a reservation's wait outside the write deadline
// (server.go). The calls that come by the thousand (forward auth, a
// take) decide in a pooled policy.Scratch, and a take of the usual shape
// is read and answered without encoding/json's reflection (takejson.go).
package httpgate
