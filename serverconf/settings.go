package serverconf

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Settings are sluice serve's listeners and store, as a configuration
// file gives them.
type Settings struct {
	// Listen is the decision API's address (default ":8080").
	Listen string
	// GRPCListen is the Envoy RateLimitService address (default
	// DefaultGRPCListen(Listen), ":8081" for the default listen;
	// grpc_listen: "" disables it).
	GRPCListen string
	// GRPCListenDerived reports that grpc_listen was not set, so that
	// GRPCListen is DefaultGRPCListen(Listen): serve derives it again when
	// a flag overrides Listen.
	GRPCListenDerived bool
	// StoreURL says where bucket state lives (default "memory://").
	StoreURL string
	// ProxyListen and ProxyUpstream configure the reverse proxy, enabled
	// when ProxyUpstream (an absolute http or https URL) is set.
	ProxyListen, ProxyUpstream string
	// ProxyUpstreamTimeout bounds the reverse proxy's wait for the
	// upstream's response headers (proxy.upstream_timeout; 0 = the
	// default of httpgate.ProxyOptions, 60s).
	ProxyUpstreamTimeout time.Duration
	// APIListen, when set, is the decision API's own address: /v1/take,
	// /v1/peek, /v1/reset and /metrics are served there and not on
	// Listen, which keeps forward auth ("" = all on Listen).
	APIListen string
	// Server bounds every HTTP listener (the server section).
	Server ServerLimits
	// GRPC bounds the Envoy RateLimitService listener (the grpc section).
	GRPC GRPCLimits
	// GRPCTLS, when set, serves the Envoy RateLimitService over TLS, and
	// with a client CA over mutual TLS (grpc_tls).
	GRPCTLS *GRPCTLS
}

// Default returns the settings of a file that gives none of them.
func Default() Settings {
	return Settings{
		Listen:            ":8080",
		GRPCListen:        DefaultGRPCListen(":8080"),
		GRPCListenDerived: true,
		StoreURL:          "memory://",
		Server:            DefaultServerLimits,
		GRPC:              DefaultGRPCLimits,
	}
}

// DefaultGRPCPort is the Envoy rate limit service's port when grpc_listen
// is not set (the reference server's).
const DefaultGRPCPort = "8081"

// DefaultGRPCListen is grpc_listen's default for a given listen: the same
// host with port 8081 (port 0, any free port, when listen's is 0). The
// gRPC service is as private as the decision API: loopback when listen is
// loopback, every interface only when listen is. It grants no more than
// the decision API does (either can charge any key; refunds over gRPC
// need allow_negative_hits), so it is never more exposed than the service
// the operator already opened.
func DefaultGRPCListen(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return net.JoinHostPort("127.0.0.1", DefaultGRPCPort)
	}
	if port != "0" {
		port = DefaultGRPCPort
	}
	return net.JoinHostPort(host, port)
}

// CheckListen returns what is wrong with a listener's address, "" when it
// is one serve can listen on.
func CheckListen(v string) string {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Sprintf("must be an address such as \":8080\" or \"127.0.0.1:8080\" (got %q)", v)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Sprintf("port %q must be a number from 0 to 65535", port)
	}
	return ""
}

// CheckStoreURL returns what is wrong with a store URL's form, "" when it
// has one (whether a store answers there is known only by connecting).
func CheckStoreURL(v string) string {
	u, err := url.Parse(v)
	if err != nil || u.Scheme == "" || !strings.Contains(v, "://") {
		return `must be a URL such as "memory://", "redis://host:6379" or "postgres://..." (not repeated: it may hold the store's password)`
	}
	return ""
}

// CheckUpstream returns what is wrong with the reverse proxy's upstream,
// "" when it is an absolute http or https URL.
func CheckUpstream(v string) string {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Sprintf("must be an absolute http:// or https:// URL (got %q)", v)
	}
	return ""
}
