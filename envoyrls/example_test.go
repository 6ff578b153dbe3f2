package envoyrls_test

import (
	"encoding/json"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/envoyrls"
)

// TestEnvoyExample reads examples/envoy.yaml as Envoy does (a v3
// Bootstrap, typed configs resolved, every field validated by the
// go-control-plane rules) and checks that its rate limit filter asks
// sluice's service.
func TestEnvoyExample(t *testing.T) {
	data, err := os.ReadFile("../examples/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("examples/envoy.yaml is not a valid Envoy bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("examples/envoy.yaml: %v", err)
	}
	var m hcm.HttpConnectionManager
	if err := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&m); err != nil {
		t.Fatal(err)
	}
	if err := m.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	var rl ratelimitfilter.RateLimit
	if err := m.HttpFilters[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	if err := rl.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	if rl.Domain != "edge" || rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "sluice" {
		t.Errorf("the filter asks domain %q of cluster %q", rl.Domain, rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName())
	}
	hc := b.StaticResources.Clusters[1].HealthChecks[0].GetGrpcHealthCheck()
	if hc.GetServiceName() != envoyrls.ServiceName {
		t.Errorf("health check of %q", hc.GetServiceName())
	}
}
