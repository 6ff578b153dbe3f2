package policy

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// FromForwardAuth describes the request a forward-auth call asks about.
//
// When the caller is in trusted_proxies and forward_auth names the front
// proxy, the original method, URI, host and client address are read from
// the headers that proxy sets (see ForwardAuth), and from no others: the
// proxy passes the client's own headers on, so X-Forwarded-Uri reaching
// sluice through an nginx that sets X-Original-URI is the client's
// invention. prefix is the path the call is routed by ("/v1/auth"), which
// Envoy's ext_authz puts before the original path. A '#' in the URI starts
// a fragment, as nginx and the URI parsers of upstreams read it, not the
// path: "/login#/../x" is /login (TestAttackNginxFragmentHidesPath).
//
// Otherwise (an untrusted caller, or no forward_auth) no header describes
// the request: the call is judged as itself, with the socket peer as the
// client.
//
// The error, for a trusted caller whose description is missing, repeated
// or malformed, says what is wrong in words a client can be shown; judging
// such a request by anything else could let it escape its rules.
func (p *Policy) FromForwardAuth(r *http.Request, prefix string) (*Input, error) {
	in := &Input{}
	if err := p.fromForwardAuth(in, r, prefix); err != nil {
		return nil, err
	}
	return in, nil
}

// fromForwardAuth is FromForwardAuth describing the request in in, a
// zero Input.
func (p *Policy) fromForwardAuth(in *Input, r *http.Request, prefix string) error {
	*in = Input{Method: r.Method, Host: r.Host, Header: r.Header}
	in.Peer, in.peerIdentity = peerOf(r)
	if r.URL != nil {
		in.Path, in.RawQuery = r.URL.Path, r.URL.RawQuery
	}
	if !in.Peer.IsValid() {
		return nil
	}
	peer := peerHost(in.Peer)
	in.ClientIP = peer
	fa := p.Settings.ForwardAuth
	if fa.Proxy == "" || !p.TrustedProxy(peer) {
		return nil
	}

	var uri string
	if fa.Proxy == "envoy" {
		ru := r.RequestURI
		if ru == "" && r.URL != nil {
			ru = r.URL.RequestURI()
		}
		rest, ok := strings.CutPrefix(ru, prefix)
		if !ok || !strings.HasPrefix(rest, "/") {
			return fmt.Errorf("forward auth (envoy): the original path must follow %s (set the ext_authz http_service's path_prefix to %s)", prefix, prefix)
		}
		uri = rest
	} else {
		var err error
		if in.Method, err = forwardedHeader(r, fa, fa.MethodHeader); err != nil {
			return err
		}
		if uri, err = forwardedHeader(r, fa, fa.URIHeader); err != nil {
			return err
		}
		if in.Host, err = forwardedHeader(r, fa, fa.HostHeader); err != nil {
			return err
		}
	}
	if !validMethod(in.Method) {
		return fmt.Errorf("forward auth (%s): the original method %q is not an HTTP method", fa.Proxy, in.Method)
	}
	if strings.ContainsAny(in.Host, ", \t") {
		return fmt.Errorf("forward auth (%s): the original host %q is not one host name", fa.Proxy, in.Host)
	}
	uri, _, _ = strings.Cut(uri, "#")
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return fmt.Errorf("forward auth (%s): the original URI %q is not a request URI", fa.Proxy, uri)
	}
	in.Path, in.RawQuery = u.Path, u.RawQuery

	hops := clientHops(r.Header, fa.ClientHeader)
	if len(hops) == 0 {
		return fmt.Errorf("forward auth (%s): the front proxy sent no %s header with the client's address", fa.Proxy, fa.ClientHeader)
	}
	in.ClientIP = p.walkHops(peer, hops)
	return nil
}

// forwardedHeader reads one attribute of the original request: a header
// the proxy sets exactly once. Two values mean that the client sent one
// and the proxy added its own instead of replacing it, and nothing tells
// which is which.
func forwardedHeader(r *http.Request, fa ForwardAuth, name string) (string, error) {
	if name == "Host" {
		return r.Host, nil
	}
	vs := r.Header.Values(name)
	switch {
	case len(vs) == 0 || strings.TrimSpace(vs[0]) == "":
		return "", fmt.Errorf("forward auth (%s): the front proxy sent no %s header (see examples/ for the headers each proxy must set)", fa.Proxy, name)
	case len(vs) > 1:
		return "", fmt.Errorf("forward auth (%s): %s was sent %d times; the front proxy must replace the client's own", fa.Proxy, name, len(vs))
	}
	return strings.TrimSpace(vs[0]), nil
}

// validMethod reports whether m is an HTTP method token.
func validMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

var (
	forwardAuthFields  = []string{"proxy", "method_header", "uri_header", "host_header", "client_header"}
	forwardAuthHeaders = forwardAuthFields[1:]
)

// forwardAuth reads forward_auth: the front proxy, and for custom the
// header of each attribute.
func (l *loader) forwardAuth(n *yaml.Node, s *Settings) {
	o := l.object(n, "forward_auth", forwardAuthFields)
	if o == nil {
		return
	}
	name, nameN, ok := o.str("proxy")
	if !o.has("proxy") {
		l.errf(o.n, "forward_auth.proxy", "is required: the front proxy that calls /v1/auth (%s)", orList(ForwardAuthProxies))
		return
	}
	if !ok {
		return
	}
	if !slices.Contains(ForwardAuthProxies, name) {
		msg := fmt.Sprintf("unknown proxy %q", name)
		if sg := Suggest(name, ForwardAuthProxies); sg != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", sg)
		} else {
			msg += " (want " + orList(ForwardAuthProxies) + ")"
		}
		l.errf(nameN, "forward_auth.proxy", "%s", msg)
		return
	}
	if name != "custom" {
		fa := forwardAuthProxies[name]
		for _, f := range forwardAuthHeaders {
			if hn, ok := o.vals[f]; ok {
				l.errf(hn, "forward_auth."+f, "applies only with proxy: custom (%s)", fa.describe())
			}
		}
		s.ForwardAuth = fa
		return
	}
	fa := ForwardAuth{Proxy: "custom"}
	dst := map[string]*string{"method_header": &fa.MethodHeader, "uri_header": &fa.URIHeader, "host_header": &fa.HostHeader, "client_header": &fa.ClientHeader}
	seen := map[string]string{}
	good := true
	for _, f := range forwardAuthHeaders {
		p := "forward_auth." + f
		v, vn, ok := o.str(f)
		switch {
		case !o.has(f):
			l.errf(o.n, p, "is required with proxy: custom (the header the proxy sets itself)")
			good = false
			continue
		case !ok:
			good = false
			continue
		}
		if msg := checkForwardHeader(f, v); msg != "" {
			l.errf(vn, p, "%s", msg)
			good = false
			continue
		}
		c := http.CanonicalHeaderKey(v)
		if other, dup := seen[c]; dup {
			l.errf(vn, p, "%q is also %s", v, other)
			good = false
			continue
		}
		seen[c] = f
		*dst[f] = c
	}
	if good {
		s.ForwardAuth = fa
	}
}

// checkForwardHeader checks a custom forward-auth header name.
func checkForwardHeader(field, v string) string {
	if v == "" || strings.Trim(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~") != "" {
		return fmt.Sprintf("must be a header name such as \"X-Original-URI\" (got %q)", v)
	}
	switch http.CanonicalHeaderKey(v) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return fmt.Sprintf("%q is a hop-by-hop header, which no proxy passes on", v)
	case "Host":
		if field != "host_header" {
			return fmt.Sprintf("%q holds the host, not the %s", v, strings.TrimSuffix(field, "_header"))
		}
	}
	return ""
}

// describe lists the headers a forward-auth proxy's attributes come from.
func (fa ForwardAuth) describe() string {
	if fa.Proxy == "envoy" {
		return "envoy: the call's own method, path after /v1/auth and Host; the client from " + fa.ClientHeader
	}
	return fmt.Sprintf("%s reads %s, %s, %s and %s", fa.Proxy, fa.MethodHeader, fa.URIHeader, fa.HostHeader, fa.ClientHeader)
}

// forwardAuthWarnings warns about a forward_auth that cannot take effect,
// and about trusted proxies whose forward-auth calls will be judged as
// the proxy's own requests.
func (l *loader) forwardAuthWarnings(o *obj, s *Settings) {
	fn, hasFA := o.vals["forward_auth"]
	tn, hasTP := o.vals["trusted_proxies"]
	switch {
	case hasFA && len(s.TrustedProxies) == 0:
		l.warnf(fn, "forward_auth", "trusted_proxies is empty, so no caller's headers are believed and /v1/auth judges every call as itself; list the front proxy's address in trusted_proxies")
	case hasTP && !hasFA && !o.has("proxy") && len(s.TrustedProxies) > 0:
		l.warnf(tn, "trusted_proxies", "forward_auth is not set, so /v1/auth believes none of a proxy's headers and counts every call it makes as the proxy's own request; name the front proxy with forward_auth: {proxy: nginx | traefik | caddy | envoy | custom}")
	}
}
