package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/lockedbuf"
)

// openStore opens the store that rawURL names ("memory://" by default),
// as serve does but without standing in for one that does not answer,
// registering its metrics with reg when not nil.
func openStore(ctx context.Context, rawURL string, reg prometheus.Registerer) (sluice.Store, func() error, error) {
	k, err := storeKindOf(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("store url %q: %w", rawURL, err)
	}
	return k.open(ctx, storeURLOrDefault(rawURL), reg)
}

// writePolicy writes a policy file for serve and returns its path.
func writePolicy(t *testing.T, yaml string) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// grpcAddr is the address serve logged for the Envoy rate limit service.
func grpcAddr(t *testing.T, logs *lockedbuf.Buffer) string {
	t.Helper()
	m := regexp.MustCompile(`server=envoy-rls addr=(\S+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("serve did not log the gRPC address:\n%s", logs.String())
	}
	return m[1]
}
