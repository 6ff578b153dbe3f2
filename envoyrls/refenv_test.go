package envoyrls_test

import (
	"os"
	"reflect"
	"regexp"
	"strings"
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

// The table of the reference server's variables in docs/envoy-gateway.md
// is envoyrls.ReferenceEnvVars: the same variables, each once.
func TestReferenceEnvVarsDocumented(t *testing.T) {
	data, err := os.ReadFile("../docs/envoy-gateway.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	_, section, ok := strings.Cut(doc, "## The reference server's other settings")
	if !ok {
		t.Fatal("docs/envoy-gateway.md has no section on the reference server's other settings")
	}
	name := regexp.MustCompile("`([A-Z][A-Z0-9_]+)`")
	documented := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
			documented[m[1]] = strings.TrimSpace(cells[2])
		}
	}
	inCode := map[string]bool{}
	for _, v := range envoyrls.ReferenceEnvVars {
		if inCode[v.Name] {
			t.Errorf("%s is in ReferenceEnvVars twice", v.Name)
		}
		inCode[v.Name] = true
		if got, ok := documented[v.Name]; !ok {
			t.Errorf("%s (%s) is not in the docs' table", v.Name, v.Treatment)
		} else if got != string(v.Treatment) {
			t.Errorf("%s: the docs say %q, the code %q", v.Name, got, v.Treatment)
		}
	}
	for n := range documented {
		if !inCode[n] {
			t.Errorf("%s is in the docs' table but not in ReferenceEnvVars", n)
		}
	}
}

// What the reference's environment says to sluice, and what it refuses
// at start, naming the variable.
func TestReadReferenceEnv(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		want    envoyrls.RefEnv
		refused string // a part of the error, "" for none
	}{
		{env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_AUTH": "u:p w", "REDIS_TLS": "true", "REDIS_TIMEOUT": "2s", "CACHE_KEY_PREFIX": "rl:"},
			want: envoyrls.RefEnv{StoreURL: "rediss://u:p%20w@redis:6379?key_prefix=rl%3A&timeout=2s"}},
		{env: map[string]string{"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379", "REDIS_AUTH": "pw", "REDIS_SENTINEL_AUTH": "pw"},
			want: envoyrls.RefEnv{StoreURL: "redis+sentinel://:pw@s1:26379,s2:26379/mymaster"}},
		{env: map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "c1:6379,c2:6379"},
			want: envoyrls.RefEnv{StoreURL: "redis+cluster://c1:6379,c2:6379"}},
		{env: map[string]string{"SHADOW_MODE": "true", "QUOTA_MODE": "1", "LIMIT_RESPONSE_HEADERS_ENABLED": "true"},
			want: envoyrls.RefEnv{Modes: envoyrls.Modes{Shadow: true, Quota: true}, Headers: []string{"trio"}}},
		{env: map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_LIMIT_HEADER": "X-RateLimit-Limit", "LIMIT_REMAINING_HEADER": "x-ratelimit-remaining", "LIMIT_RESET_HEADER": "X-RateLimit-Reset"},
			want: envoyrls.RefEnv{Headers: []string{"legacy"}}},
		{env: map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "false"}, want: envoyrls.RefEnv{Headers: []string{"none"}}},
		{env: map[string]string{"NEAR_LIMIT_RATIO": "0.5", "LOCAL_CACHE_SIZE_IN_BYTES": "1000", "REDIS_PIPELINE_WINDOW": "150us", "REDIS_PIPELINE_LIMIT": "8", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true", "GRPC_SERVER_USE_TLS": "false"}},
		{env: map[string]string{"SHADOW_MODE": "yes"}, refused: `SHADOW_MODE="yes": want true or false`},
		{env: map[string]string{"LIMIT_RESET_HEADER": "X-Reset"}, refused: "LIMIT_RESET_HEADER"},
		{env: map[string]string{"REDIS_SOCKET_TYPE": "unix"}, refused: "REDIS_SOCKET_TYPE: sluice reaches Redis over TCP only"},
		{env: map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "s1:26379"}, refused: "master name"},
		{env: map[string]string{"REDIS_URL": "a:1,b:2"}, refused: "REDIS_TYPE=sentinel or cluster"},
		{env: map[string]string{"REDIS_TLS_CACERT": "/ca.pem"}, refused: "REDIS_TLS_CACERT"},
		{env: map[string]string{"BACKEND_TYPE": "memcache"}, refused: "BACKEND_TYPE"},
		{env: map[string]string{"REDIS_PERSECOND": "true"}, refused: "REDIS_PERSECOND"},
		{env: map[string]string{"MERGE_DOMAIN_CONFIG": "true"}, refused: "MERGE_DOMAIN_CONFIG"},
		{env: map[string]string{"RESPONSE_DYNAMIC_METADATA": "true"}, refused: "RESPONSE_DYNAMIC_METADATA"},
		{env: map[string]string{"GRPC_UDS": "/tmp/rl.sock"}, refused: "GRPC_UDS"},
	} {
		got, err := envoyrls.ReadReferenceEnv(func(k string) string { return tc.env[k] })
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%v: %v", tc.env, err)
		case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("%v: error %v, want one with %q", tc.env, err, tc.refused)
		case tc.refused == "" && !reflect.DeepEqual(got, tc.want):
			t.Errorf("%v: %+v, want %+v", tc.env, got, tc.want)
		}
	}
}

// A reference-format file is served with the environment's global modes
// and headers, and a refused variable stops it at start.
func TestParserReferenceEnvModes(t *testing.T) {
	file := []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	env := map[string]string{"SHADOW_MODE": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "false"}
	parse := envoyrls.Parser(func(k string) string { return env[k] })
	p, _, err := parse("ref.yaml", file)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Settings.Headers, []string{"none"}) {
		t.Errorf("headers %v", p.Settings.Headers)
	}
	h := start(t, p)
	expect(t, h.call(t, "d", 0, desc("k", "a")), OK, OK, 0)
	resp := h.call(t, "d", 0, desc("k", "a"))
	expect(t, resp, OK, OVER, 0)
	if len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("headers sent: %v", resp.ResponseHeadersToAdd)
	}
	env["MERGE_DOMAIN_CONFIG"] = "true"
	if _, _, err := parse("ref.yaml", file); err == nil || !strings.Contains(err.Error(), "MERGE_DOMAIN_CONFIG") {
		t.Errorf("a refused variable: %v", err)
	}
}

// A refused variable is named without its value: REDIS_SENTINEL_AUTH's is
// a password, and the refusal goes to the log of a failed start.
func TestAttackRefusedEnvEchoesPassword(t *testing.T) {
	env := map[string]string{"REDIS_URL": "m,s1:26379", "REDIS_TYPE": "sentinel", "REDIS_AUTH": "storepw", "REDIS_SENTINEL_AUTH": "hunter2-sentinel"}
	_, err := envoyrls.ReadReferenceEnv(func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), "REDIS_SENTINEL_AUTH") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("%v: want REDIS_SENTINEL_AUTH refused without its value", err)
	}
}
