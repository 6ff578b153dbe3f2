package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/envoyrls/xds"
)

// TestServeXDSReferenceEnv runs sluice serve with the environment Envoy
// Gateway gives the reference server (CONFIG_TYPE=GRPC_XDS_SOTW and its
// CONFIG_GRPC_XDS_* variables) against go-control-plane's server on its
// snapshot cache: /readyz fails until the first snapshot is applied, then
// Envoy's calls get the snapshot's limits over gRPC, and the xDS metrics
// say so.
func TestServeXDSReferenceEnv(t *testing.T) {
	cp := startControlPlane(t)
	t.Setenv("CONFIG_TYPE", "GRPC_XDS_SOTW")
	t.Setenv("CONFIG_GRPC_XDS_SERVER_URL", cp.addr)
	t.Setenv("CONFIG_GRPC_XDS_NODE_ID", "eg-ratelimit")
	t.Setenv("CONFIG_GRPC_XDS_NODE_METADATA", "cluster=test")
	t.Setenv("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10ms")
	t.Setenv("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "100ms")
	addrs, logs := startServeArgs(t, "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0")
	get := func(path string) (int, string) { return httpGet(t, addrs.API, path) }
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "no rate limit configuration") {
		t.Fatalf("/readyz before a snapshot: %d %s", code, body)
	}
	cp.push(t, "eg-ratelimit", "1", &rlsconf.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "rule-0-match-0", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 1, Unit: rlsconf.RateLimitUnit_YEAR}},
	}})
	waitStatus(t, addrs.API, "/readyz", 200, logs.String)
	conn, err := grpc.NewClient(addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	ask := func() rlspb.RateLimitResponse_Code {
		resp, err := rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "rule-0-match-0", Value: "alice"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	if a, b := ask(), ask(); a != rlspb.RateLimitResponse_OK || b != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("1/year for one value: %v then %v", a, b)
	}
	if _, m := get("/metrics"); !strings.Contains(m, "sluice_xds_applied 1") || !strings.Contains(m, "sluice_xds_snapshots_applied_total 1") {
		t.Fatalf("xds metrics:\n%s", grepLines(m, "sluice_xds"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestEnvoyGatewayExample reads examples/envoy-gateway: Envoy Gateway's
// configuration swaps its rate limit Deployment's image and command for
// sluice serve, keeping the Redis backend (the only one Envoy Gateway
// has), and the environment Envoy Gateway then gives the container is one
// sluice follows a control plane with.
func TestEnvoyGatewayExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(examplesDir, "envoy-gateway", "envoy-gateway-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Kind     string            `yaml:"kind"`
		Metadata map[string]string `yaml:"metadata"`
		Data     map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(data, &cm); err != nil {
		t.Fatal(err)
	}
	if cm.Kind != "ConfigMap" || cm.Metadata["name"] != "envoy-gateway-config" || cm.Metadata["namespace"] != "envoy-gateway-system" {
		t.Fatalf("not Envoy Gateway's configuration: %+v", cm)
	}
	var eg struct {
		Kind     string `yaml:"kind"`
		Provider struct {
			Kubernetes struct {
				RateLimitDeployment struct {
					Container struct {
						Image string `yaml:"image"`
					} `yaml:"container"`
					Patch struct {
						Type  string `yaml:"type"`
						Value struct {
							Spec struct {
								Template struct {
									Spec struct {
										Containers []struct {
											Name    string   `yaml:"name"`
											Command []string `yaml:"command"`
										} `yaml:"containers"`
									} `yaml:"spec"`
								} `yaml:"template"`
							} `yaml:"spec"`
						} `yaml:"value"`
					} `yaml:"patch"`
				} `yaml:"rateLimitDeployment"`
			} `yaml:"kubernetes"`
		} `yaml:"provider"`
		RateLimit struct {
			Backend struct {
				Type  string `yaml:"type"`
				Redis struct {
					URL string `yaml:"url"`
				} `yaml:"redis"`
			} `yaml:"backend"`
		} `yaml:"rateLimit"`
	}
	dec := yaml.NewDecoder(strings.NewReader(cm.Data["envoy-gateway.yaml"]))
	dec.KnownFields(false)
	if err := dec.Decode(&eg); err != nil {
		t.Fatal(err)
	}
	rd := eg.Provider.Kubernetes.RateLimitDeployment
	cs := rd.Patch.Value.Spec.Template.Spec.Containers
	if eg.Kind != "EnvoyGateway" || !strings.Contains(rd.Container.Image, "sluice") || rd.Patch.Type != "StrategicMerge" ||
		len(cs) != 1 || cs[0].Name != "envoy-ratelimit" || strings.Join(cs[0].Command, " ") != "/sluice serve" {
		t.Fatalf("the rate limit deployment is not swapped for sluice serve: %+v", rd)
	}
	if eg.RateLimit.Backend.Type != "Redis" || eg.RateLimit.Backend.Redis.URL == "" {
		t.Fatalf("backend: %+v", eg.RateLimit.Backend)
	}
	// What Envoy Gateway sets on the container (its ratelimit resource
	// translator), read as sluice serve reads it.
	env := map[string]string{
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt", "REDIS_URL": eg.RateLimit.Backend.Redis.URL, "GRPC_PORT": "8081",
		"USE_STATSD": "false", "USE_PROMETHEUS": "true", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
	}
	cfg, ok, err := xds.FromEnv(func(k string) string { return env[k] })
	if err != nil || !ok || cfg.Server != "envoy-gateway:18001" || cfg.NodeID != "envoy-ratelimit" || !cfg.TLS || cfg.CAFile != "/certs/ca.crt" || cfg.CertFile != "/certs/tls.crt" {
		t.Fatalf("FromEnv: %+v %v %v", cfg, ok, err)
	}
}
