package envoyrls_test

import (
	"os"
	"testing"

	"github.com/sluicehq/sluice/envoyrls"
)

// A reference-format file takes its store and gRPC address from the
// reference server's environment variables; sluice's own format goes to
// the policy package untouched.
func TestParserReferenceFormat(t *testing.T) {
	env := map[string]string{"REDIS_URL": "127.0.0.1:16379", "REDIS_AUTH": "s3cr@t", "GRPC_PORT": "18081"}
	parse := envoyrls.Parser(func(k string) string { return env[k] })
	data, err := os.ReadFile("../examples/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, s, err := parse("ratelimit-config.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if s.StoreURL != "redis://:s3cr%40t@127.0.0.1:16379" || s.GRPCListen != ":18081" || s.GRPCListenDerived {
		t.Errorf("settings from the environment: store %q, grpc %q (derived %v)", s.StoreURL, s.GRPCListen, s.GRPCListenDerived)
	}
	if _, _, err := parse("bad.yaml", []byte("domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")); err == nil {
		t.Error("an invalid unit was accepted")
	}
	own := []byte("store: {url: \"memory://\"}\nrules:\n  - name: r\n    algorithm: token_bucket\n    algorithm_config: {rps: 1, burst: 1}\n")
	if p, s, err := parse("own.yaml", own); err != nil || len(p.Rules) != 1 || s.StoreURL != "memory://" {
		t.Errorf("own format: %v (the environment must not apply to it)", err)
	}
}

func TestReferenceEnv(t *testing.T) {
	for _, tc := range []struct {
		env         map[string]string
		store, grpc string
	}{
		{nil, "", ""},
		{map[string]string{"REDIS_URL": "cache:6379"}, "redis://cache:6379", ""},
		{map[string]string{"REDIS_URL": "rediss://cache:6380/1", "REDIS_AUTH": "ignored"}, "rediss://cache:6380/1", ""},
		{map[string]string{"GRPC_HOST": "10.0.0.1", "GRPC_PORT": "8081"}, "", "10.0.0.1:8081"},
		{map[string]string{"GRPC_HOST": "::1", "GRPC_PORT": "8081"}, "", "[::1]:8081"},
	} {
		store, grpc := envoyrls.ReferenceEnv(func(k string) string { return tc.env[k] })
		if store != tc.store || grpc != tc.grpc {
			t.Errorf("%v: %q %q, want %q %q", tc.env, store, grpc, tc.store, tc.grpc)
		}
	}
}
