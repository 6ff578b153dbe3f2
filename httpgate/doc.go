// Package httpgate puts sluice's policies in front of HTTP traffic: the JSON
// decision API (/v1/take, /v1/peek, /v1/reset), forward auth for nginx
// auth_request, Traefik ForwardAuth, Caddy forward_auth and Envoy ext_authz
// (/v1/auth), a
// reverse proxy, a Go middleware, Prometheus metrics and an audit log of
// rejections.
//
// Every request-shaped path (forward auth, proxy, middleware) answers the
// same way: policy.Match builds each applicable rule's key, policy.Enforce
// decides all of them at once, and RateLimitHeaders turns the verdict into
// the response fields. A rejection is a 429 (or the configured deny status)
// with an application/problem+json body of type quota-exceeded.
package httpgate
