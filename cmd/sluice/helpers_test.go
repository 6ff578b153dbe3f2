package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/sluicehq/sluice/internal/lockedbuf"
)

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
