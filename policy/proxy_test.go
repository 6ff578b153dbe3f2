package policy_test

import (
	"strings"
	"testing"
	"time"
)

// proxy.upstream_timeout: how long the reverse proxy waits for the
// upstream's response headers.
func TestProxyUpstreamTimeout(t *testing.T) {
	const rules = "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"
	const proxy = "proxy:\n  listen: \":9000\"\n  upstream: http://app:8000\n"
	if p := mustServer(t, proxy+rules); p.ProxyUpstreamTimeout != 0 {
		t.Errorf("default: %v, want 0 (the proxy's own default)", p.ProxyUpstreamTimeout)
	}
	if p := mustServer(t, proxy+"  upstream_timeout: 5m\n"+rules); p.ProxyUpstreamTimeout != 5*time.Minute {
		t.Errorf("5m: %v", p.ProxyUpstreamTimeout)
	}
	for _, c := range []struct{ cfg, want string }{
		{proxy + "  upstream_timeout: 0s\n" + rules, `c.yaml:4: proxy.upstream_timeout: must be > 0 (got "0s"): an upstream that never answers would hold every request sent to it`},
		{proxy + "  upstream_timeout: -1s\n" + rules, `c.yaml:4: proxy.upstream_timeout: must be > 0 (got "-1s")`},
		{proxy + "  upstream_timeout: 60\n" + rules, `c.yaml:4: proxy.upstream_timeout: must be a duration with a unit, such as "60s" (got the number 60)`},
		{proxy + "  upstream_timeout: soon\n" + rules, `c.yaml:4: proxy.upstream_timeout: must be a duration such as "1m" or "500ms" (got "soon")`},
		{"proxy: {upstream_timeout: 5s}\n" + rules, "c.yaml:1: proxy.upstream_timeout: applies only with proxy.upstream and proxy.listen"},
		{proxy + "  upstream_timout: 5s\n" + rules, `c.yaml:4: proxy.upstream_timout: unknown field (did you mean "upstream_timeout"?)`},
	} {
		got := strings.Join(problems(t, c.cfg), "\n")
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("%q:\ngot  %s\nwant %s", c.cfg, got, c.want)
		}
	}
}
