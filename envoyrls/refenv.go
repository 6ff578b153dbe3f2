package envoyrls

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/serverconf"
)

// Modes are the reference server's global modes, read from its
// environment. Shadow (SHADOW_MODE) answers every call OK overall, each
// descriptor's status as it is; Quota (QUOTA_MODE) makes every descriptor
// a quota-mode one, so a call is refused only when every descriptor that
// is not unlimited is over its limit.
type Modes struct{ Shadow, Quota bool }

// Apply serves pol, a policy made by ParseReferenceConfig or
// ParseReferenceResources, with m; any other policy is left as it is. It
// must be called before pol is served.
func (m Modes) Apply(pol *policy.Policy) {
	if ref := referenceOf(pol); ref != nil {
		ref.modes = m
	}
}

// Treatment is what sluice does with one of the reference server's
// environment variables.
type Treatment string

const (
	// Honoured: the variable means in sluice what it means there.
	Honoured Treatment = "honoured"
	// Refused: a value sluice cannot honour stops serve at start, naming
	// the variable and what to do instead; the others are honoured.
	Refused Treatment = "refused"
	// Ignored: it changes nothing sluice answers (statistics, logs,
	// connection tuning), or sluice always behaves one way; Why says which.
	Ignored Treatment = "ignored"
)

// EnvVar is one of the reference server's environment variables.
type EnvVar struct {
	Name      string
	Treatment Treatment
	Why       string
	// refuse says why value v cannot be honoured ("" when it can); nil
	// when every value can.
	refuse func(v string, getenv func(string) string) string
}

func refuseTrue(what string) func(string, func(string) string) string {
	return func(v string, _ func(string) string) string {
		if b, err := strconv.ParseBool(v); err != nil || b {
			return what
		}
		return ""
	}
}

// refuseUnless refuses every value but want, in any case.
func refuseUnless(want, what string) func(string, func(string) string) string {
	return func(v string, _ func(string) string) string {
		if strings.EqualFold(v, want) {
			return ""
		}
		return what
	}
}

func refuseSet(what string) func(string, func(string) string) string {
	return func(string, func(string) string) string { return what }
}

// treatedAlike is variables that sluice treats alike, for the same reason.
func treatedAlike(t Treatment, why string, names ...string) []EnvVar {
	out := make([]EnvVar, len(names))
	for i, n := range names {
		out[i] = EnvVar{Name: n, Treatment: t, Why: why}
	}
	return out
}

// ReferenceEnvVars is every environment variable of the reference server
// (envoyproxy/ratelimit's src/settings/settings.go) and what sluice does
// with it, so that none is silently dropped: docs/envoy-gateway.md lists
// the same table.
var ReferenceEnvVars = func() []EnvVar {
	vs := []EnvVar{
		{Name: "CONFIG_TYPE", Treatment: Honoured, Why: "GRPC_XDS_SOTW follows the control plane; FILE is --config"},
		{Name: "REDIS_URL", Treatment: Honoured, Why: "the store: host:port, or a whole sluice store URL"},
		{Name: "REDIS_AUTH", Treatment: Honoured, Why: "the store's password (user:password with a user)"},
		{Name: "REDIS_TYPE", Treatment: Refused, Why: "SINGLE, SENTINEL (REDIS_URL master,host:port,...) and CLUSTER map to redis://, redis+sentinel:// and redis+cluster://", refuse: func(v string, _ func(string) string) string {
			switch strings.ToLower(v) {
			case "single", "sentinel", "cluster":
				return ""
			}
			return "want SINGLE, SENTINEL or CLUSTER"
		}},
		{Name: "REDIS_SOCKET_TYPE", Treatment: Refused, Why: "sluice dials Redis over TCP: unix is refused (name a host:port in REDIS_URL and set tcp)", refuse: refuseUnless("tcp", "sluice reaches Redis over TCP only: set REDIS_SOCKET_TYPE=tcp and a host:port in REDIS_URL")},
		{Name: "REDIS_TLS", Treatment: Honoured, Why: "true makes the store URL rediss://"},
		{Name: "REDIS_TLS_CACERT", Treatment: Refused, Why: "the store verifies Redis with the system's roots", refuse: refuseSet("the Redis store verifies its server with the system's certificate roots: add the CA to the image's roots and unset REDIS_TLS_CACERT")},
		{Name: "REDIS_TLS_CLIENT_CERT", Treatment: Refused, Why: "the store sends no client certificate", refuse: refuseSet("the Redis store sends no client certificate: use REDIS_AUTH and unset REDIS_TLS_CLIENT_CERT")},
		{Name: "REDIS_TLS_CLIENT_KEY", Treatment: Refused, Why: "the store sends no client certificate", refuse: refuseSet("the Redis store sends no client certificate: use REDIS_AUTH and unset REDIS_TLS_CLIENT_KEY")},
		{Name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Treatment: Refused, Why: "true is refused: the store verifies the certificate whole", refuse: refuseTrue("the Redis store verifies its server's certificate whole: give Redis a certificate for its name, or put skip_verify=true in a rediss:// REDIS_URL knowing it skips every check")},
		{Name: "REDIS_SENTINEL_AUTH", Treatment: Refused, Why: "the sentinels are asked with REDIS_AUTH: a different password is refused", refuse: func(v string, getenv func(string) string) string {
			if v == getenv("REDIS_AUTH") {
				return ""
			}
			return "sluice asks the sentinels with REDIS_AUTH's credentials: give them the same password and unset REDIS_SENTINEL_AUTH"
		}},
		{Name: "REDIS_TIMEOUT", Treatment: Honoured, Why: "the store's per-call timeout (the store URL's timeout)"},
		{Name: "CACHE_KEY_PREFIX", Treatment: Honoured, Why: "the store's key prefix (the store URL's key_prefix)"},
		{Name: "BACKEND_TYPE", Treatment: Refused, Why: "redis only: memcache is refused", refuse: refuseUnless("redis", "sluice keeps its buckets in Redis, PostgreSQL or memory, not memcache: set BACKEND_TYPE=redis")},
		{Name: "REDIS_PERSECOND", Treatment: Refused, Why: "true is refused: per-second limits share the one store", refuse: refuseTrue("sluice keeps every limit in one store: unset REDIS_PERSECOND (per-second limits then share REDIS_URL's Redis)")},
		{Name: "GRPC_HOST", Treatment: Honoured, Why: "the gRPC listener's host"},
		{Name: "GRPC_PORT", Treatment: Honoured, Why: "the gRPC listener's port"},
		{Name: "GRPC_UDS", Treatment: Refused, Why: "sluice's gRPC listener is TCP", refuse: refuseSet("sluice serves gRPC over TCP: unset GRPC_UDS and use GRPC_HOST/GRPC_PORT")},
		{Name: "GRPC_SERVER_USE_TLS", Treatment: Honoured, Why: "true serves gRPC over TLS with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (as a config file's grpc_tls)"},
		{Name: "GRPC_SERVER_TLS_CERT", Treatment: Honoured, Why: "the gRPC server's certificate (chain), with GRPC_SERVER_USE_TLS=true"},
		{Name: "GRPC_SERVER_TLS_KEY", Treatment: Honoured, Why: "the gRPC server's private key, with GRPC_SERVER_USE_TLS=true"},
		{Name: "GRPC_CLIENT_TLS_CACERT", Treatment: Honoured, Why: "the CA client certificates must chain to: mutual TLS, with GRPC_SERVER_USE_TLS=true"},
		{Name: "GRPC_CLIENT_TLS_SAN", Treatment: Honoured, Why: "a subject alternative name client certificates must carry, with GRPC_CLIENT_TLS_CACERT"},
		{Name: "GRPC_SERVER_TLS_CA_CERT", Treatment: Ignored, Why: "Envoy Gateway sets it; the reference reads no such variable (its client CA is GRPC_CLIENT_TLS_CACERT), so Envoy is served over TLS without a client certificate asked for, by both"},
		{Name: "SHADOW_MODE", Treatment: Honoured, Why: "every call is answered OK overall, its statuses as they are"},
		{Name: "QUOTA_MODE", Treatment: Honoured, Why: "every descriptor is a quota descriptor"},
		{Name: "LIMIT_RESPONSE_HEADERS_ENABLED", Treatment: Honoured, Why: "true sends the three headers alone, false none; unset, sluice sends its default RateLimit headers"},
		{Name: "LIMIT_LIMIT_HEADER", Treatment: Refused, Why: "names other than the RateLimit-* or X-RateLimit-* trio are refused", refuse: headerNames},
		{Name: "LIMIT_REMAINING_HEADER", Treatment: Refused, Why: "as LIMIT_LIMIT_HEADER", refuse: headerNames},
		{Name: "LIMIT_RESET_HEADER", Treatment: Refused, Why: "as LIMIT_LIMIT_HEADER", refuse: headerNames},
		{Name: "RESPONSE_DYNAMIC_METADATA", Treatment: Refused, Why: "true is refused: sluice sends no dynamic metadata", refuse: refuseTrue("sluice sends no dynamic metadata: unset RESPONSE_DYNAMIC_METADATA")},
		{Name: "MERGE_DOMAIN_CONFIG", Treatment: Refused, Why: "true is refused: a domain named twice is an error", refuse: refuseTrue("sluice refuses a domain named by two configurations rather than merging them: unset MERGE_DOMAIN_CONFIG and name each domain once")},
		{Name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Treatment: Ignored, Why: "sluice never charges a refused call (close to true); with false, the reference's default, it counts a refused call's hits too, which only lengthens a rejection within the same window"},
		{Name: "LOCAL_CACHE_SIZE_IN_BYTES", Treatment: Ignored, Why: "a cache of keys over their limit until the window ends: the answers are the same without it (the Redis store has its own over-limit shortcut)"},
		{Name: "NEAR_LIMIT_RATIO", Treatment: Ignored, Why: "only the reference's near_limit statistic"},
		{Name: "EXPIRATION_JITTER_MAX_SECONDS", Treatment: Ignored, Why: "only when Redis keys expire, after their window"},
		{Name: "FORCE_START_WITHOUT_INITIAL_CONFIG", Treatment: Ignored, Why: "sluice always starts without waiting for a first snapshot (the reference's true); /readyz fails until one is applied"},
		{Name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Treatment: Honoured, Why: "true: /healthcheck answers 500 until a first configuration is applied (else OK at once, as the reference's)"},
	}
	vs = append(vs, treatedAlike(Honoured, "the xDS client (with CONFIG_TYPE=GRPC_XDS_SOTW)", "CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")...)
	vs = append(vs, treatedAlike(Ignored, "the store multiplexes one connection per node; no pool to size", "REDIS_POOL_SIZE", "REDIS_POOL_ON_EMPTY_BEHAVIOR")...)
	vs = append(vs, treatedAlike(Ignored, "the store pipelines concurrent calls by itself; these tune only latency", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM")...)
	vs = append(vs, treatedAlike(Ignored, "sluice starts without waiting for Redis; /readyz asks the store, and a failing store follows on_store_error (allow)", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME")...)
	vs = append(vs, treatedAlike(Ignored, "read only with REDIS_PERSECOND=true, which is refused", "REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL", "REDIS_PERSECOND_POOL_SIZE", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_SENTINEL_AUTH", "REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT", "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "REDIS_PERSECOND_TIMEOUT", "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR")...)
	vs = append(vs, treatedAlike(Ignored, "read only with BACKEND_TYPE=memcache, which is refused", "MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS", "MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION")...)
	vs = append(vs, treatedAlike(Ignored, "connection lifetime only; a sluice config file's grpc section bounds connections", "GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE")...)
	vs = append(vs, treatedAlike(Ignored, "sluice's HTTP listener is --listen (default :8080, as PORT's), which answers the reference's /healthcheck too; it has no debug listener", "HOST", "PORT", "DEBUG_HOST", "DEBUG_PORT")...)
	vs = append(vs, treatedAlike(Ignored, "logs only", "LOG_LEVEL", "LOG_FORMAT")...)
	vs = append(vs, treatedAlike(Ignored, "with CONFIG_TYPE=FILE the file is --config, reloaded when it changes", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT")...)
	vs = append(vs, treatedAlike(Ignored, "statistics only: sluice serves Prometheus metrics at /metrics on its HTTP listener", "USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "USE_STATSD", "STATSD_HOST", "STATSD_PORT", "EXTRA_TAGS", "STATS_FLUSH_INTERVAL", "DISABLE_STATS", "USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH", "PROMETHEUS_MAPPER_YAML", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")...)
	vs = append(vs, treatedAlike(Ignored, "tracing only", "TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE")...)
	return vs
}()

// headerNames refuses header names sluice cannot send: it sends the
// RateLimit-Limit/-Remaining/-Reset trio or the X-RateLimit-* one (its
// header sets trio and legacy), as the three names together choose.
func headerNames(_ string, getenv func(string) string) string {
	if _, err := headerSet(getenv); err != nil {
		return err.Error()
	}
	return ""
}

// headerSet is the sluice header set that the three header names choose.
func headerSet(getenv func(string) string) (string, error) {
	names := [3]string{getenv("LIMIT_LIMIT_HEADER"), getenv("LIMIT_REMAINING_HEADER"), getenv("LIMIT_RESET_HEADER")}
	trio := [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}
	legacy := [3]string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	for i := range names {
		names[i] = cmp.Or(names[i], trio[i]) // the reference's defaults
	}
	is := func(want [3]string) bool {
		return strings.EqualFold(names[0], want[0]) && strings.EqualFold(names[1], want[1]) && strings.EqualFold(names[2], want[2])
	}
	switch {
	case is(trio):
		return policy.SetTrio, nil
	case is(legacy):
		return policy.SetLegacy, nil
	}
	return "", fmt.Errorf("headers %s, %s, %s: sluice sends either %s or %s: set LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER to one of them, or unset them", names[0], names[1], names[2], strings.Join(trio[:], ", "), strings.Join(legacy[:], ", "))
}

// responseHeaders is the header sets LIMIT_RESPONSE_HEADERS_ENABLED
// chooses with the names (headerSet): nil when it is unset (the policy's
// own sets stand), none when false.
func responseHeaders(getenv func(string) string) ([]string, error) {
	v := getenv("LIMIT_RESPONSE_HEADERS_ENABLED")
	if v == "" {
		return nil, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return nil, fmt.Errorf("LIMIT_RESPONSE_HEADERS_ENABLED=%q: want true or false", v)
	}
	if !on {
		return []string{policy.SetNone}, nil
	}
	set, err := headerSet(getenv)
	if err != nil {
		return nil, nil // refused with the header names' variables
	}
	return []string{set}, nil
}

// RefEnv is what the reference server's environment says to sluice (see
// ReferenceEnvVars): each field is zero when its variables are unset.
type RefEnv struct {
	// StoreURL is the store, in sluice's URL form.
	StoreURL string
	// GRPCAddr is the gRPC listener's address.
	GRPCAddr string
	// Modes are SHADOW_MODE and QUOTA_MODE.
	Modes Modes
	// Headers are the response header sets (policy.Settings.Headers).
	Headers []string
	// GRPCTLS serves gRPC over TLS (GRPC_SERVER_USE_TLS and its files),
	// nil for plaintext.
	GRPCTLS *serverconf.GRPCTLS
	// HealthyOnceApplied makes /healthcheck fail until a first
	// configuration is applied (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
	HealthyOnceApplied bool
}

// Server is srv with what the environment says of the server: the store,
// the gRPC listener's address and its TLS.
func (e RefEnv) Server(srv serverconf.Settings) serverconf.Settings {
	srv.StoreURL = cmp.Or(e.StoreURL, srv.StoreURL)
	if e.GRPCAddr != "" {
		srv.GRPCListen, srv.GRPCListenDerived = e.GRPCAddr, false
	}
	srv.GRPCTLS = cmp.Or(e.GRPCTLS, srv.GRPCTLS)
	return srv
}

// ReadReferenceEnv reads the reference server's environment through
// getenv, for a reference-format file or CONFIG_TYPE=GRPC_XDS_SOTW. A
// value sluice cannot honour is an error naming the variable and what to
// do instead (every such variable at once).
func ReadReferenceEnv(getenv func(string) string) (RefEnv, error) {
	var errs []error
	var out RefEnv
	said := map[string]bool{} // the three header names share one reason
	for _, v := range ReferenceEnvVars {
		if val := getenv(v.Name); val != "" && v.refuse != nil {
			if why := v.refuse(val, getenv); why != "" && !said[why] {
				said[why] = true
				errs = append(errs, fmt.Errorf("%s: %s", v.Name, why)) // not val: REDIS_SENTINEL_AUTH's is a password
			}
		}
	}
	boolean := func(name string, into *bool) {
		if v := getenv(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: want true or false", name, v))
			}
			*into = b
		}
	}
	boolean("SHADOW_MODE", &out.Modes.Shadow)
	boolean("QUOTA_MODE", &out.Modes.Quota)
	boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", &out.HealthyOnceApplied)
	var grpcTLS bool
	boolean("GRPC_SERVER_USE_TLS", &grpcTLS)
	if grpcTLS {
		t, err := serverconf.LoadGRPCTLS(getenv("GRPC_SERVER_TLS_CERT"), getenv("GRPC_SERVER_TLS_KEY"), getenv("GRPC_CLIENT_TLS_CACERT"), getenv("GRPC_CLIENT_TLS_SAN"))
		if err != nil {
			errs = append(errs, fmt.Errorf("GRPC_SERVER_USE_TLS=true (GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY, GRPC_CLIENT_TLS_CACERT, GRPC_CLIENT_TLS_SAN): %w", err))
		}
		out.GRPCTLS = t
	}
	var tlsOn bool
	boolean("REDIS_TLS", &tlsOn)
	if h, err := responseHeaders(getenv); err != nil {
		errs = append(errs, err)
	} else {
		out.Headers = h
	}
	u, err := storeURL(getenv, tlsOn)
	if err != nil {
		errs = append(errs, err)
	}
	out.StoreURL = u
	if port := getenv("GRPC_PORT"); port != "" {
		out.GRPCAddr = net.JoinHostPort(getenv("GRPC_HOST"), port)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("the reference server's environment: %w", errors.Join(errs...))
	}
	return out, nil
}

// storeURL is the store URL that REDIS_URL, REDIS_AUTH, REDIS_TYPE,
// REDIS_TLS, REDIS_TIMEOUT and CACHE_KEY_PREFIX describe; REDIS_URL
// already a URL is taken whole. "" when REDIS_URL is unset.
func storeURL(getenv func(string) string, tlsOn bool) (string, error) {
	raw := getenv("REDIS_URL")
	if raw == "" || strings.Contains(raw, "://") {
		return raw, nil
	}
	userinfo := ""
	if auth := getenv("REDIS_AUTH"); auth != "" {
		// The reference reads "user:password", else a password alone.
		if user, pass, ok := strings.Cut(auth, ":"); ok {
			userinfo = url.UserPassword(user, pass).String() + "@"
		} else {
			userinfo = ":" + url.QueryEscape(auth) + "@"
		}
	}
	scheme, hosts, path := "redis", raw, ""
	switch strings.ToLower(getenv("REDIS_TYPE")) {
	case "sentinel":
		master, rest, ok := strings.Cut(raw, ",")
		if !ok || master == "" || rest == "" {
			return "", fmt.Errorf("REDIS_URL=%q: with REDIS_TYPE=sentinel, want the master name and the sentinels: mymaster,host:port,host:port", raw)
		}
		scheme, hosts, path = "redis+sentinel", rest, "/"+url.PathEscape(master)
	case "cluster":
		scheme = "redis+cluster"
	default:
		if strings.Contains(raw, ",") {
			return "", fmt.Errorf("REDIS_URL=%q: several addresses need REDIS_TYPE=sentinel or cluster", raw)
		}
	}
	if tlsOn {
		if scheme != "redis" {
			return "", fmt.Errorf("REDIS_TLS=true with REDIS_TYPE=%s: sluice's TLS store URL is rediss:// for one server; unset REDIS_TLS or use a single server", getenv("REDIS_TYPE"))
		}
		scheme = "rediss"
	}
	q := url.Values{}
	if v := getenv("REDIS_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return "", fmt.Errorf("REDIS_TIMEOUT=%q: want a positive duration such as 250ms", v)
		}
		q.Set("timeout", d.String())
	}
	if p := getenv("CACHE_KEY_PREFIX"); p != "" {
		q.Set("key_prefix", p)
	}
	u := scheme + "://" + userinfo + hosts + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u, nil
}
