// Package xds reads the reference rate limit server's configuration
// (envoyproxy/ratelimit's RateLimitConfig resources) from an xDS control
// plane over ADS, state of the world, as the reference server does with
// CONFIG_TYPE=GRPC_XDS_SOTW, and hands each snapshot that compiles to sluice
// serve as a policy (a policy.Source). It is what puts sluice where Envoy
// Gateway deploys the reference server.
package xds

import (
	"bytes"
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/internal/defaults"
)

// Config says where the control plane is and how to reach it. Its
// defaults (WithDefaults) are the reference server's.
type Config struct {
	// Server is the control plane's gRPC address, host:port (Envoy
	// Gateway's is envoy-gateway.envoy-gateway-system:18001).
	Server string
	// NodeID and NodeMetadata identify this server to the control plane,
	// which picks the snapshot by them (node id "default" unless set).
	NodeID       string
	NodeMetadata map[string]string
	// Headers are sent with the stream (gRPC metadata).
	Headers map[string]string
	// TLS, when set, reaches the server over TLS: CAFile verifies it
	// (else the system roots), ServerName overrides the name checked,
	// CertFile and KeyFile are this client's certificate for mutual TLS.
	TLS                       bool
	CAFile, CertFile, KeyFile string
	ServerName                string
	// ConnectRetryInterval is the least time between connection attempts
	// while the server cannot be reached (default 3s).
	ConnectRetryInterval time.Duration
	// Backoff paces new streams after one ends: Initial, doubled after
	// each stream that brought nothing, up to Max, each wait drawn in
	// [wait*(1-RandomFactor), wait] when Jitter (default 10s, 60s, 0.5,
	// on, as the reference server's).
	Backoff Backoff
	// UnreadyWhenLost fails /readyz while the control plane cannot be
	// reached (the last policy it sent still serves either way); by default
	// only the time before the first snapshot is unready.
	UnreadyWhenLost bool
	// HealthyOnceApplied fails the reference's /healthcheck until a first
	// snapshot is applied (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED); by
	// default it answers OK at once, as the reference's does.
	HealthyOnceApplied bool
	// MaxRecvBytes bounds a response (default 4 MiB).
	MaxRecvBytes int
	// Modes are the reference server's global SHADOW_MODE and QUOTA_MODE
	// that every snapshot's policy is served with (from the environment;
	// a config file has no such setting).
	Modes envoyrls.Modes
}

// Backoff paces reconnections (see Config.Backoff).
type Backoff struct {
	Initial, Max time.Duration
	RandomFactor float64
	Jitter       bool
}

// DefaultMaxRecvBytes bounds a control plane's response as the reference
// server's client does (grpc-go's default), so that sluice takes what it
// takes: a snapshot compiles to many times its size in memory.
const DefaultMaxRecvBytes = 4 << 20

// WithDefaults fills what c leaves unset with the reference server's
// defaults.
func (c Config) WithDefaults() Config {
	c.NodeID = cmp.Or(c.NodeID, "default")
	defaults.Set(&c.ConnectRetryInterval, 3*time.Second)
	defaults.Set(&c.Backoff.Initial, 10*time.Second)
	defaults.Set(&c.Backoff.Max, 60*time.Second)
	c.Backoff.Max = max(c.Backoff.Max, c.Backoff.Initial)
	defaults.Set(&c.MaxRecvBytes, DefaultMaxRecvBytes)
	return c
}

// TLSConfig is the client's TLS configuration; nil without TLS.
func (c Config) TLSConfig() (*tls.Config, error) {
	if !c.TLS {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("xds: server CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("xds: server CA %s: no PEM certificate in it", c.CAFile)
		}
		t.RootCAs = pool
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("xds: a client certificate needs both its certificate and its key file")
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("xds: client certificate: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// FromEnv reads the reference server's environment through getenv: ok is
// false unless CONFIG_TYPE is GRPC_XDS_SOTW. Each variable is the
// reference's (see docs/envoy-gateway.md); a value that does not parse is
// an error naming it.
func FromEnv(getenv func(string) string) (c Config, ok bool, err error) {
	if !strings.EqualFold(getenv("CONFIG_TYPE"), "GRPC_XDS_SOTW") {
		return c, false, nil
	}
	var errs []error
	dur := func(name string, into *time.Duration) {
		if v := getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a positive duration such as 10s", name, v))
				return
			}
			*into = d
		}
	}
	boolean := func(name string, into *bool) {
		if v := getenv(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: want true or false", name, v))
				return
			}
			*into = b
		}
	}
	c.Server = cmp.Or(getenv("CONFIG_GRPC_XDS_SERVER_URL"), "localhost:18000") // the reference server's default
	c.NodeID = getenv("CONFIG_GRPC_XDS_NODE_ID")
	c.NodeMetadata = pairs(getenv("CONFIG_GRPC_XDS_NODE_METADATA"), "=")
	c.Headers = pairs(getenv("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"), ":")
	boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", &c.TLS)
	c.CertFile = getenv("CONFIG_GRPC_XDS_CLIENT_TLS_CERT")
	c.KeyFile = getenv("CONFIG_GRPC_XDS_CLIENT_TLS_KEY")
	c.CAFile = getenv("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
	c.ServerName = getenv("CONFIG_GRPC_XDS_SERVER_TLS_SAN")
	dur("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", &c.ConnectRetryInterval)
	dur("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", &c.Backoff.Initial)
	dur("XDS_CLIENT_BACKOFF_MAX_INTERVAL", &c.Backoff.Max)
	c.Backoff.Jitter = true
	boolean("XDS_CLIENT_BACKOFF_JITTER", &c.Backoff.Jitter)
	c.Backoff.RandomFactor = 0.5
	if v := getenv("XDS_CLIENT_BACKOFF_RANDOM_FACTOR"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			errs = append(errs, fmt.Errorf("XDS_CLIENT_BACKOFF_RANDOM_FACTOR=%q: want a number from 0 to 1", v))
		}
		c.Backoff.RandomFactor = f
	}
	if v := getenv("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=%q: want a positive number of bytes", v))
		}
		c.MaxRecvBytes = n
	}
	if len(errs) > 0 {
		return c, true, errors.Join(errs...)
	}
	return c.WithDefaults(), true, nil
}

// pairs reads "k1=v1,k2=v2" (sep "=") or "k1:v1,k2:v2" (sep ":"), as the
// reference server reads its node metadata and headers; entries without
// the separator are skipped, as there.
func pairs(s, sep string) map[string]string {
	if s == "" {
		return nil
	}
	out := map[string]string{}
	for _, e := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(e, sep)
		if ok && k != "" {
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
}

// fileSection is the xds section of a sluice configuration file.
type fileSection struct {
	Server               string            `yaml:"server"`
	NodeID               string            `yaml:"node_id"`
	NodeMetadata         map[string]string `yaml:"node_metadata"`
	Headers              map[string]string `yaml:"headers"`
	TLS                  *fileTLS          `yaml:"tls"`
	ConnectRetryInterval string            `yaml:"connect_retry_interval"`
	Backoff              *fileBackoff      `yaml:"backoff"`
	UnreadyWhenLost      bool              `yaml:"unready_when_lost"`
	MaxRecvBytes         int               `yaml:"max_recv_bytes"`
}

type fileTLS struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

type fileBackoff struct {
	Initial      string   `yaml:"initial"`
	Max          string   `yaml:"max"`
	RandomFactor *float64 `yaml:"random_factor"`
	Jitter       *bool    `yaml:"jitter"`
}

// FromFile reads the xds section of a sluice configuration file (data,
// read from name): ok is false when it has none. Errors name the file,
// line and field.
func FromFile(name string, data []byte) (c Config, ok bool, err error) {
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return c, false, nil // not this package's to report: the policy loader does
	}
	top := doc.Content[0]
	var sec *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == "xds" {
			sec = top.Content[i+1]
		}
	}
	if sec == nil {
		return c, false, nil
	}
	at := func(n *yaml.Node, field, format string, a ...any) error {
		return fmt.Errorf("%s:%d: xds.%s: %s", name, n.Line, field, fmt.Sprintf(format, a...))
	}
	if sec.Kind != yaml.MappingNode {
		return c, true, at(sec, "", "want a mapping with server and node_id")
	}
	if err := checkFields(sec, "", map[string]map[string]bool{
		"":        {"server": true, "node_id": true, "node_metadata": true, "headers": true, "tls": true, "connect_retry_interval": true, "backoff": true, "unready_when_lost": true, "max_recv_bytes": true},
		"tls":     {"ca_file": true, "cert_file": true, "key_file": true, "server_name": true},
		"backoff": {"initial": true, "max": true, "random_factor": true, "jitter": true},
	}, at); err != nil {
		return c, true, err
	}
	var fs fileSection
	if err := sec.Decode(&fs); err != nil {
		return c, true, fmt.Errorf("%s: xds: %w", name, err)
	}
	if fs.Server == "" {
		return c, true, at(sec, "server", "required: the control plane's host:port")
	}
	c = Config{Server: fs.Server, NodeID: fs.NodeID, NodeMetadata: fs.NodeMetadata, Headers: fs.Headers, UnreadyWhenLost: fs.UnreadyWhenLost, MaxRecvBytes: fs.MaxRecvBytes}
	c.Backoff.RandomFactor, c.Backoff.Jitter = 0.5, true
	if fs.TLS != nil {
		c.TLS, c.CAFile, c.CertFile, c.KeyFile, c.ServerName = true, fs.TLS.CAFile, fs.TLS.CertFile, fs.TLS.KeyFile, fs.TLS.ServerName
	}
	dur := func(field, v string, into *time.Duration) error {
		if v == "" {
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return at(sec, field, "%q: want a positive duration such as 10s", v)
		}
		*into = d
		return nil
	}
	if err := dur("connect_retry_interval", fs.ConnectRetryInterval, &c.ConnectRetryInterval); err != nil {
		return c, true, err
	}
	if b := fs.Backoff; b != nil {
		if err := errors.Join(dur("backoff.initial", b.Initial, &c.Backoff.Initial), dur("backoff.max", b.Max, &c.Backoff.Max)); err != nil {
			return c, true, err
		}
		if b.RandomFactor != nil {
			if *b.RandomFactor < 0 || *b.RandomFactor > 1 {
				return c, true, at(sec, "backoff.random_factor", "%v: want a number from 0 to 1", *b.RandomFactor)
			}
			c.Backoff.RandomFactor = *b.RandomFactor
		}
		if b.Jitter != nil {
			c.Backoff.Jitter = *b.Jitter
		}
	}
	if fs.MaxRecvBytes < 0 {
		return c, true, at(sec, "max_recv_bytes", "must not be negative")
	}
	return c.WithDefaults(), true, nil
}

// checkFields refuses keys the section does not know, at their line: a
// misspelt "node_id" must not silently subscribe as "default".
func checkFields(n *yaml.Node, path string, known map[string]map[string]bool, at func(*yaml.Node, string, string, ...any) error) error {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		field := k.Value
		if path != "" {
			field = path + "." + k.Value
		}
		if !known[path][k.Value] {
			return at(k, field, "unknown field")
		}
		if _, nested := known[k.Value]; nested && path == "" && v.Kind == yaml.MappingNode {
			if err := checkFields(v, k.Value, known, at); err != nil {
				return err
			}
		}
	}
	return nil
}
