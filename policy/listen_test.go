package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/serverconf"
)

func TestServerSettings(t *testing.T) {
	const rule = "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"
	p, srv := mustParse(t, rule), mustServer(t, rule)
	if srv.Server != serverconf.DefaultServerLimits || srv.APIListen != "" || p.Settings.APITokenEnv != "" {
		t.Fatalf("defaults: %+v %+v", srv, p.Settings)
	}
	if d := srv.Server; d.ReadHeaderTimeout <= 0 || d.ReadTimeout <= 0 || d.WriteTimeout <= 0 || d.IdleTimeout <= 0 || d.MaxHeaderBytes <= 0 {
		t.Fatalf("a default leaves a listener without a bound: %+v", d)
	}
	t.Setenv("SLUICE_TEST_API_TOKEN", "0123456789abcdef")
	const cfg = `listen: "127.0.0.1:8080"
api_listen: "127.0.0.1:8082"
api_token_env: SLUICE_TEST_API_TOKEN
server:
  read_header_timeout: 2s
  read_timeout: 3s
  write_timeout: 4s
  idle_timeout: 5s
  max_header_bytes: 8192
  max_conns: 100
  shutdown_drain: 0s
`
	p, srv = mustParse(t, cfg+rule), mustServer(t, cfg+rule)
	want := serverconf.ServerLimits{ReadHeaderTimeout: 2 * time.Second, ReadTimeout: 3 * time.Second, WriteTimeout: 4 * time.Second,
		IdleTimeout: 5 * time.Second, MaxHeaderBytes: 8192, MaxConns: 100, ShutdownDrain: 0}
	if srv.Server != want || srv.APIListen != "127.0.0.1:8082" || p.Settings.APITokenEnv != "SLUICE_TEST_API_TOKEN" {
		t.Fatalf("settings: %+v %+v", srv, p.Settings)
	}
	// A drain of zero is kept: it turns the drain off.
	if got := srv.Server.WithDefaults(); got.ShutdownDrain != 0 {
		t.Fatalf("WithDefaults replaced shutdown_drain 0 with %v", got.ShutdownDrain)
	}
	if serverconf.DefaultServerLimits.ShutdownDrain != 5*time.Second {
		t.Fatalf("default shutdown_drain %v, documented as 5s", serverconf.DefaultServerLimits.ShutdownDrain)
	}
	// Zero fields (a policy built in code) take the defaults.
	if got := (serverconf.ServerLimits{MaxConns: 7}).WithDefaults(); got.MaxConns != 7 || got.ReadTimeout != serverconf.DefaultServerLimits.ReadTimeout {
		t.Fatalf("WithDefaults: %+v", got)
	}
}

func TestServerSettingsErrors(t *testing.T) {
	const rule = "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"
	t.Setenv("SLUICE_TEST_SHORT_TOKEN", "short")
	t.Setenv("SLUICE_TEST_EMPTY_TOKEN", "")
	cases := []struct {
		name, cfg string
		want      []string
	}{
		{"token variable unset", "api_token_env: SLUICE_TEST_EMPTY_TOKEN\n" + rule,
			[]string{"c.yaml:1: api_token_env: environment variable SLUICE_TEST_EMPTY_TOKEN is not set or empty"}},
		{"short token", "api_token_env: SLUICE_TEST_SHORT_TOKEN\n" + rule,
			[]string{"c.yaml:1: api_token_env: the token in SLUICE_TEST_SHORT_TOKEN is 5 bytes; use at least 16 (random, such as: openssl rand -hex 32)"}},
		{"short admin token", "admin_token_env: SLUICE_TEST_SHORT_TOKEN\n" + rule,
			[]string{"c.yaml:1: admin_token_env: the token in SLUICE_TEST_SHORT_TOKEN is 5 bytes; use at least 16 (random, such as: openssl rand -hex 32)"}},
		{"not a variable", "api_token_env: \"a b\"\n" + rule,
			[]string{`c.yaml:1: api_token_env: must be the name of an environment variable, such as SLUICE_API_TOKEN (got "a b")`}},
		{"api_listen", "api_listen: \"8082\"\n" + rule,
			[]string{`c.yaml:1: api_listen: must be an address such as ":8080" or "127.0.0.1:8080" (got "8082")`}},
		{"api_listen on listen's address", "listen: \":9000\"\napi_listen: \":9000\"\n" + rule,
			[]string{`c.yaml:2: api_listen: ":9000" is also listen's address`}},
		{"server", `server:
  read_header_timeout: 0s
  read_timeout: -1s
  write_timeout: soon
  idle_timeout: 1m
  max_header_bytes: 100
  max_conns: 0
  max_con: 5
  shutdown_drain: -1s
` + rule, []string{
			`c.yaml:2: server.read_header_timeout: must be > 0 (got "0s"): a listener without this deadline can be held by a client that never finishes`,
			`c.yaml:3: server.read_timeout: must be > 0 (got "-1s"): a listener without this deadline can be held by a client that never finishes`,
			`c.yaml:4: server.write_timeout: must be a duration such as "1m" or "500ms" (got "soon")`,
			"c.yaml:6: server.max_header_bytes: must be between 4096 and 16777216 (got 100)",
			"c.yaml:7: server.max_conns: must be between 1 and 1048576 (got 0)",
			`c.yaml:8: server.max_con: unknown field (did you mean "max_conns"?)`,
			`c.yaml:9: server.shutdown_drain: must be between 0s (no drain) and 10m0s (got "-1s")`,
		}},
		{"server kind", "server: 5s\n" + rule, []string{"c.yaml:1: server: must be a mapping of fields (got the string \"5s\")"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := problems(t, tc.cfg)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
