package httpgate

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/defaults"
	"github.com/sluicehq/sluice/policy"
)

// ProxyOptions tunes the reverse proxy's transport. Zero values take the
// defaults noted.
type ProxyOptions struct {
	// DialTimeout bounds connecting to the upstream (default 10s).
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for the upstream's response
	// headers (default 60s; proxy.upstream_timeout in a policy); past it
	// the client gets a 504. A body, such as an event stream, may then
	// run as long as it likes.
	ResponseHeaderTimeout time.Duration
	// IdleConnTimeout closes idle upstream connections (default 90s).
	IdleConnTimeout time.Duration
	// TrustedPeer reports whether the inbound peer is a trusted proxy whose
	// X-Forwarded-For is extended rather than replaced. Nil trusts none.
	TrustedPeer func(netip.Addr) bool
	// Logger receives the details of upstream failures, which the client
	// is not shown (default slog.Default()).
	Logger *slog.Logger
}

// clientAddressHeaders are the headers besides X-Forwarded-For and
// Forwarded (which httputil.ReverseProxy already rewrites) that upstreams
// and their frameworks take as the client's address, host, scheme,
// original URL or method (Symfony and Laravel read a POST's
// X-HTTP-Method-Override). A client sends them to pose as another address,
// path or method to the upstream; the proxy never passes them on.
var clientAddressHeaders = slices.Concat(policy.AddressHeaders[2:], []string{"X-Forwarded-Port", "X-Forwarded-Server",
	"X-Forwarded-Ssl", "X-Forwarded-Scheme", "X-Url-Scheme", "Front-End-Https",
	"X-Forwarded-Prefix", "X-Forwarded-Uri", "X-Forwarded-Method",
	"X-Original-Uri", "X-Original-Url", "X-Original-Method", "X-Original-Host",
	"X-Rewrite-Url", "X-Envoy-Original-Path", "X-Http-Method-Override", "X-Http-Method", "X-Method-Override",
})

// NewReverseProxy forwards requests to upstream with
// httputil.ReverseProxy: hop-by-hop headers are dropped, Upgrade requests
// (websockets) are passed through, responses are flushed as they arrive so
// event streams and long polls stream, X-Forwarded-For/-Host/-Proto are
// set, other client-sent forwarding headers (X-Real-IP and the like) are
// dropped, and an unreachable or slow upstream is a 502 or 504 problem
// whose detail (with the upstream's address) goes to the log, not to the
// client. A failure that is the client's is neither: a client that went
// away is not answered, a body that cannot be read is a 400.
func NewReverseProxy(upstream *url.URL, opts ProxyOptions) *httputil.ReverseProxy {
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	defaults.Set(&opts.DialTimeout, 10*time.Second)
	defaults.Set(&opts.ResponseHeaderTimeout, 60*time.Second)
	defaults.Set(&opts.IdleConnTimeout, 90*time.Second)
	tr := &http.Transport{
		Proxy:                 nil, // never send upstream traffic through an environment proxy
		DialContext:           (&net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       opts.IdleConnTimeout,
		TLSHandshakeTimeout:   opts.DialTimeout,
		ResponseHeaderTimeout: opts.ResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			// Keep the client's Host header? Upstreams behind a proxy
			// usually expect their own; SetURL already set it. Extend the
			// forwarding chain only when the peer is a proxy we trust.
			if peer := policy.PeerAddr(pr.In.RemoteAddr); peer.IsValid() && opts.TrustedPeer != nil && opts.TrustedPeer(peer) {
				pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			}
			pr.SetXForwarded()
			for _, h := range clientAddressHeaders {
				pr.Out.Header.Del(h)
			}
			dropCookie(pr.Out.Header, uiCookie)
			if pr.Out.Body != nil && pr.Out.Body != http.NoBody {
				pr.Out.Body = &clientBody{ReadCloser: pr.Out.Body}
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// The transport reports the client's failures as its own (a
			// client hanging up mid-upload is an unexpected EOF reading
			// from its connection): they are not the upstream's, and a
			// 502 for them would tell the log, and the adaptive rates,
			// that the upstream failed.
			if errors.Is(r.Context().Err(), context.Canceled) {
				opts.Logger.Debug("proxy: the client went away", "method", r.Method, "path", r.URL.Path, "err", err)
				return // nobody to answer
			}
			if b, ok := r.Body.(*clientBody); ok && b.failed.Load() {
				opts.Logger.Debug("proxy: the client's request body could not be read", "method", r.Method, "path", r.URL.Path, "err", err)
				writeProblem(w, Problem{Status: http.StatusBadRequest, Detail: "the request body could not be read"})
				return
			}
			status := http.StatusBadGateway
			var ne net.Error
			if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
				status = http.StatusGatewayTimeout
			}
			detail := "upstream unreachable"
			if status == http.StatusGatewayTimeout {
				detail = "upstream timed out"
			}
			// The error names the upstream's internal address: log it,
			// never show it to the client.
			opts.Logger.Warn("proxy: "+detail, "method", r.Method, "path", r.URL.Path, "err", err)
			writeProblem(w, Problem{Status: status, Detail: detail})
		},
	}
}

// clientBody is a proxied request's body, noting whether reading it
// failed: the client hung up mid-upload or sent a body that is not HTTP,
// which the transport then reports as its own failure.
type clientBody struct {
	io.ReadCloser
	failed atomic.Bool
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if adaptive.ClientFailed(err) {
		b.failed.Store(true)
	}
	return n, err
}

// Proxy returns the reverse proxy handler: requests the current policy
// admits are forwarded to upstream (with the rate limit fields added to
// the upstream's response); rejected ones are answered here with a 429
// and never reach the upstream.
func (g *Gate) Proxy(upstream *url.URL, opts ProxyOptions) http.Handler {
	if opts.TrustedPeer == nil {
		// Only a chain the trusted proxy writes is extended: behind one
		// that writes another header (client_header), X-Forwarded-For is
		// the client's.
		opts.TrustedPeer = func(a netip.Addr) bool {
			pol := g.Policy()
			return pol.Settings.ClientHeader == "X-Forwarded-For" && pol.TrustedProxy(a)
		}
	}
	opts.Logger = cmp.Or(opts.Logger, g.opts.Logger)
	h := g.Wrap(NewReverseProxy(upstream, opts))
	// The rules judge what the upstream is sent: the headers Connection
	// names are hop-by-hop, which the proxy drops (but an upgrade's), so
	// they go before the decision (TestAttackConnectionHeaderHidesKeyFromUpstream).
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, f := range r.Header["Connection"] {
			for name := range strings.SplitSeq(f, ",") {
				if name = textproto.TrimString(name); !strings.EqualFold(name, "Upgrade") {
					r.Header.Del(name)
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}

// dropCookie removes the cookie called name from h's Cookie headers,
// keeping the others as they were sent. The live page's session cookie
// is scoped to a host, and browsers send a host's cookies to each of its
// ports: the proxy in front of an upstream on the same host as the page
// would otherwise hand the upstream a session that opens the page.
func dropCookie(h http.Header, name string) {
	lines := h.Values("Cookie")
	if len(lines) == 0 {
		return
	}
	var kept []string
	changed := false
	for _, line := range lines {
		var parts []string
		for _, c := range strings.Split(line, ";") {
			if n, _, _ := strings.Cut(strings.TrimSpace(c), "="); n == name {
				changed = true
				continue
			}
			parts = append(parts, strings.TrimSpace(c))
		}
		if len(parts) > 0 {
			kept = append(kept, strings.Join(parts, "; "))
		}
	}
	if !changed {
		return
	}
	h.Del("Cookie")
	for _, line := range kept {
		h.Add("Cookie", line)
	}
}
