package httpgate

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// ForwardAuth serves /v1/auth for nginx auth_request, Traefik ForwardAuth
// and Caddy forward_auth: it applies the rules to the original request the
// proxy describes and answers 200 to let it through, or the deny status
// with the rate limit fields and a quota-exceeded problem body.
//
// The original request is read from X-Forwarded-Method (or
// X-Original-Method), X-Forwarded-Uri (or X-Original-URI),
// X-Forwarded-Host and X-Forwarded-For, and the other headers the proxy
// passes on, but only when the socket peer is in trusted_proxies;
// otherwise anyone could pick their own key by sending those headers, and
// the request is judged as the call to /v1/auth it is.
//
// The deny status is the policy's deny_status (default 429), or the
// deny_status query parameter (a 4xx): nginx's auth_request turns every
// status but 2xx, 401 and 403 into a 500, so nginx asks for 403 and maps it
// back to a 429 (see examples/nginx.conf).
func (g *Gate) ForwardAuth(w http.ResponseWriter, r *http.Request) {
	p := g.Policy()
	status := p.Settings.DenyStatus
	if q := r.URL.Query().Get("deny_status"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 400 || n > 499 {
			badRequest(w, http.StatusBadRequest, fmt.Sprintf("deny_status %q: want a 4xx status such as 403 or 429", q))
			return
		}
		status = n
	}
	if status == 0 {
		status = http.StatusTooManyRequests
	}
	in := p.FromHTTP(r)
	if in.Peer.IsValid() && p.TrustedProxy(in.Peer.Addr()) {
		if m := first(r.Header, "X-Forwarded-Method", "X-Original-Method"); m != "" {
			in.Method = m
		}
		if h := first(r.Header, "X-Forwarded-Host"); h != "" {
			in.Host, _, _ = strings.Cut(h, ",")
			in.Host = strings.TrimSpace(in.Host)
		}
		if raw := first(r.Header, "X-Forwarded-Uri", "X-Original-URI", "X-Original-Url"); raw != "" {
			u, err := url.ParseRequestURI(raw)
			if err != nil {
				// A trusted proxy sent garbage; judging the request
				// by another path could let it escape its rule.
				badRequest(w, http.StatusBadRequest, fmt.Sprintf("forwarded URI %q: %v", raw, err))
				return
			}
			in.Path, in.Query = u.Path, u.Query()
		}
	}
	if g.enforce(w, r, p, in, status) {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
	}
}

// first returns the first non-empty value among the named headers.
func first(h http.Header, names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(h.Get(n)); v != "" {
			return v
		}
	}
	return ""
}
