package main

// The recipes of docs/recipes.md, each a directory of examples/recipes:
// every policy passes sluice check, the page shows every file byte for
// byte, and each recipe runs end to end here where its parts exist (real
// nginx, Caddy and Redis in front of or behind a real sluice serve).
// Traefik and Envoy have no binary here: their configs are read in their
// own formats, checked to ask the sluice endpoints the policy serves, and
// sluice is asked as they ask it.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/internal/proxytest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/policy"
)

const recipesDir = examplesDir + "/recipes"

// recipeChecks adds the recipes' files to TestExamples, which fails on a
// file under examples/ that nothing checks. The recipe tests below run
// them; these are the format checks every example gets.
var recipeChecks = map[string]func(t *testing.T, path string){
	"recipes/nginx/policy.yaml":             checkRecipePolicy,
	"recipes/nginx/nginx.conf":              checkBraces,
	"recipes/caddy/policy.yaml":             checkRecipePolicy,
	"recipes/caddy/Caddyfile":               checkBraces,
	"recipes/traefik/policy.yaml":           checkRecipePolicy,
	"recipes/traefik/traefik.yaml":          checkTraefikExample,
	"recipes/envoy/policy.yaml":             checkRecipePolicy,
	"recipes/envoy/envoy.yaml":              checkRecipeEnvoyBootstrap,
	"recipes/jwt-plans/policy.yaml":         checkRecipePolicy,
	"recipes/api-key-redis/policy.yaml":     checkRecipePolicy,
	"recipes/llm-gateway/policy.yaml":       checkRecipePolicy,
	"recipes/login/policy.yaml":             checkRecipePolicy,
	"recipes/third-party-quota/policy.yaml": checkRecipePolicy,
	"recipes/kubernetes/policy.yaml":        checkRecipePolicy,
	"recipes/kubernetes/ingress.yaml":       checkRecipeKubernetesIngress,
	// Go: built and run by go test in its own package (TestLibraryRecipe).
	"recipes/library/main.go":      func(*testing.T, string) {},
	"recipes/library/main_test.go": func(*testing.T, string) {},
}

func init() { maps.Copy(exampleChecks, recipeChecks) }

// TestRecipesCheck runs sluice check on every recipe's policy, as a
// reader would before serving it: each is valid and draws no warning.
func TestRecipesCheck(t *testing.T) {
	t.Setenv("SLUICE_JWT_SECRET", "0123456789abcdef0123456789abcdef")
	policies, err := filepath.Glob(recipesDir + "/*/policy.yaml")
	if err != nil || len(policies) < 10 {
		t.Fatalf("recipe policies %v (%v)", policies, err)
	}
	var out, errb bytes.Buffer
	if code := run(append([]string{"check"}, policies...), &out, &errb); code != 0 || errb.Len() != 0 {
		t.Fatalf("sluice check: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if n := strings.Count(out.String(), ": ok ("); n != len(policies) {
		t.Fatalf("sluice check said ok %d times for %d files:\n%s", n, len(policies), out.String())
	}
}

// checkRecipePolicy is sluice check on one recipe policy, warnings
// included.
func checkRecipePolicy(t *testing.T, path string) {
	t.Setenv("SLUICE_JWT_SECRET", "0123456789abcdef0123456789abcdef")
	var out, errb bytes.Buffer
	if code := run([]string{"check", path}, &out, &errb); code != 0 || errb.Len() != 0 {
		t.Fatalf("sluice check %s: exit %d\n%s", path, code, errb.String())
	}
}

// TestRecipesDocShowsFiles: docs/recipes.md shows each file of
// examples/recipes (tests aside) once, byte for byte, in a fenced block
// right after a "<!-- examples/recipes/DIR/FILE -->" line, so the page
// cannot drift from the files the tests run.
func TestRecipesDocShowsFiles(t *testing.T) {
	doc, err := os.ReadFile("../../docs/recipes.md")
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]int{}
	lines := strings.SplitAfter(string(doc), "\n")
	marker := regexp.MustCompile(`^<!-- (examples/recipes/\S+) -->\n$`)
	for i := 0; i < len(lines); i++ {
		m := marker.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		name := m[1]
		shown[name]++
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			t.Errorf("docs/recipes.md:%d: %s is not followed by a fenced block", i+1, name)
			continue
		}
		var b strings.Builder
		j := i + 2
		for ; j < len(lines) && lines[j] != "```\n"; j++ {
			b.WriteString(lines[j])
		}
		want, err := os.ReadFile("../../" + name)
		if err != nil {
			t.Errorf("docs/recipes.md:%d: %v", i+1, err)
			continue
		}
		if b.String() != string(want) {
			t.Errorf("docs/recipes.md:%d: the block differs from %s; paste the file again", i+1, name)
		}
		i = j
	}
	err = filepath.WalkDir(recipesDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, _ := filepath.Rel("../..", path)
		if n := shown[filepath.ToSlash(rel)]; n != 1 {
			t.Errorf("docs/recipes.md shows %s %d times, want once", rel, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The contents and links of the page are checked with every other
	// page's (TestDocLinksResolve, in the root package); here, that each
	// recipe has a heading.
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "## ") && l != "## Contents\n" {
			n++
		}
	}
	if n < 11 {
		t.Errorf("docs/recipes.md has %d recipe headings, want 11 or more", n)
	}
}

// recipePolicy writes the recipe's policy with the pairs rewritten (the
// addresses of the test's own servers) and returns its path.
func recipePolicy(t *testing.T, recipe string, pairs ...[2]string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(recipesDir, recipe, "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	cfg := proxytest.Rewrite(t, recipe+"/policy.yaml", string(data), pairs...)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// recipeFile reads a file of a recipe.
func recipeFile(t *testing.T, recipe, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(recipesDir, recipe, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// recipeApp is the app behind the front proxy; it counts what reaches it.
func recipeApp(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app: "+r.URL.Path) }
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(app.Close)
	return app, &hits
}

func hostPort(u string) string { return strings.TrimPrefix(u, "http://") }

// answer is one response, read whole.
type answer struct {
	status int
	header http.Header
	body   string
}

func send(t *testing.T, req *http.Request) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func get(t *testing.T, url string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return send(t, req)
}

// untilLimited sends requests until one is refused, and checks the count
// that passed against the limit: at least its burst (refills only add),
// at most the burst plus what the rate refilled while the requests ran,
// however slowly they ran. It returns the count and the refusal; an
// answer other than 200 or a refusal fails the test.
func untilLimited(t *testing.T, burst int, perSecond float64, do func() answer, refused func(answer) bool) (passed int, last answer) {
	t.Helper()
	start := time.Now()
	const most = 2000
	for passed = 0; passed < most; passed++ {
		a := do()
		if refused(a) {
			last = a
			break
		}
		if a.status != http.StatusOK {
			t.Fatalf("request %d: %d %v %q", passed+1, a.status, a.header, a.body)
		}
	}
	bound := burst + int(math.Ceil(perSecond*time.Since(start).Seconds())) + 1
	if passed < burst || passed > bound {
		t.Fatalf("%d requests passed before a refusal, want %d to %d (the burst, plus what %.3g/s refilled in %v)", passed, burst, bound, perSecond, time.Since(start))
	}
	if passed == most {
		t.Skipf("the limit refilled as fast as this machine sent %d requests", most)
	}
	return passed, last
}

// staysLimited checks that forged requests of a limited client stay in
// its bucket: from a moment its plain request was refused (its bucket
// held less than a token), burst+5 forged ones pass no more than what
// perSecond refilled since, where a bucket of their own would pass the
// burst. A bound that holds at any speed: on a machine so slow that the
// refill covers the burst, the check says nothing and is skipped.
func staysLimited(t *testing.T, burst int, perSecond float64, plain, forged func() answer) {
	t.Helper()
	var empty time.Time
	for range 100 {
		at := time.Now()
		if plain().status == http.StatusTooManyRequests {
			empty = at
			break
		}
	}
	if empty.IsZero() {
		t.Skip("the limit refilled as fast as this machine sent requests")
	}
	passed := 0
	for range burst + 5 {
		if forged().status == http.StatusOK {
			passed++
		}
	}
	refilled := 1 + int(math.Ceil(perSecond*time.Since(empty).Seconds()))
	if refilled >= burst {
		t.Logf("%v passed between the refusal and the last forged request: no bound", time.Since(empty))
		return
	}
	if passed > refilled {
		t.Errorf("%d of %d requests forging another address passed, more than the %d the client's own bucket refilled: they went to a bucket of their own", passed, burst+5, refilled)
	}
}

// getFrom is get from another loopback address (127.0.0.2): another
// client, as the proxy in front sees it.
func getFrom(t *testing.T, local, url string) answer {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func is429(a answer) bool { return a.status == http.StatusTooManyRequests }

// wantRefusal checks a 429 as sluice writes it, through whatever proxy.
func wantRefusal(t *testing.T, a answer, rule string) {
	t.Helper()
	if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") == "" ||
		!strings.Contains(a.header.Get("RateLimit-Policy"), `"`+rule+`"`) || a.header.Get("X-Sluice-Reason") == "" ||
		!strings.Contains(a.body, "quota-exceeded") {
		t.Fatalf("refusal: %d %v %q, want sluice's 429 for %s", a.status, a.header, a.body, rule)
	}
}

// TestRecipeNginx runs the nginx recipe: sluice serve on its policy, a
// real nginx on its nginx.conf in front of an app. A client gets its
// burst of 20, then nginx's 429 with sluice's fields, and headers it
// forges move it to no other bucket.
func TestRecipeNginx(t *testing.T) {
	app, hits := recipeApp(t, nil)
	l, _ := startServe(t, "--config", recipePolicy(t, "nginx"))
	addr := proxytest.FreeAddr(t)
	logs := proxytest.Nginx(t, proxytest.Rewrite(t, "nginx.conf", recipeFile(t, "nginx", "nginx.conf"),
		[2]string{"server 127.0.0.1:8080;", "server " + l.API + ";"},
		[2]string{"server 127.0.0.1:3000;", "server " + hostPort(app.URL) + ";"},
		[2]string{"listen 127.0.0.1:8000;", "listen " + addr + ";"},
	), addr)
	passed, last := untilLimited(t, 20, 10, func() answer { return get(t, "http://"+addr+"/orders") }, is429)
	wantRefusal(t, last, "per-ip")
	if hits.Load() != int64(passed) {
		t.Errorf("the app saw %d requests, want the %d admitted\n%s", hits.Load(), passed, logs())
	}
	staysLimited(t, 20, 10, func() answer { return get(t, "http://"+addr+"/orders") }, func() answer {
		return get(t, "http://"+addr+"/orders", "X-Real-IP", "192.0.2.9", "X-Forwarded-For", "192.0.2.9", "X-Original-URI", "/other")
	})
	// Without forward_auth and trusted_proxies, every client would share
	// nginx's bucket.
	if a := getFrom(t, "127.0.0.2", "http://"+addr+"/orders"); a.status != http.StatusOK {
		t.Errorf("another client address: %d %q", a.status, a.body)
	}
}

// TestRecipeCaddy runs the Caddy recipe in a real Caddy: the burst, then
// sluice's own 429 passed on as it is.
func TestRecipeCaddy(t *testing.T) {
	app, hits := recipeApp(t, nil)
	l, _ := startServe(t, "--config", recipePolicy(t, "caddy"))
	addr := proxytest.FreeAddr(t)
	logs := proxytest.Caddy(t, proxytest.Rewrite(t, "Caddyfile", recipeFile(t, "caddy", "Caddyfile"),
		[2]string{"http://127.0.0.1:8000 {", "http://" + addr + " {"},
		[2]string{"forward_auth 127.0.0.1:8080 {", "forward_auth " + l.API + " {"},
		[2]string{"reverse_proxy 127.0.0.1:3000\n", "reverse_proxy " + hostPort(app.URL) + "\n"},
	), addr)
	passed, last := untilLimited(t, 20, 10, func() answer { return get(t, "http://"+addr+"/orders") }, is429)
	wantRefusal(t, last, "per-ip")
	if hits.Load() != int64(passed) {
		t.Errorf("the app saw %d requests, want the %d admitted\n%s", hits.Load(), passed, logs())
	}
	staysLimited(t, 20, 10, func() answer { return get(t, "http://"+addr+"/orders") }, func() answer {
		return get(t, "http://"+addr+"/orders", "X-Forwarded-For", "192.0.2.9")
	})
	if a := getFrom(t, "127.0.0.2", "http://"+addr+"/orders"); a.status != http.StatusOK {
		t.Errorf("another client address: %d %q", a.status, a.body)
	}
}

// TestRecipeTraefik reads the Traefik recipe's file (no Traefik here):
// its middleware asks the policy's listen address for /v1/auth and the
// router uses it. Then sluice serve is asked as Traefik asks it, for two
// clients: each gets a burst of its own.
func TestRecipeTraefik(t *testing.T) {
	path := filepath.Join(recipesDir, "traefik", "traefik.yaml")
	doc := readYAML(t, path)[0]
	cf, p, err := loadPolicy(filepath.Join(recipesDir, "traefik", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	srv := cf.Server()
	if a := dig(doc, "http", "middlewares", "sluice", "forwardAuth", "address"); a != "http://"+srv.Listen+"/v1/auth" {
		t.Errorf("forwardAuth.address %v, want the policy's listen %s", a, srv.Listen)
	}
	if v := dig(doc, "http", "middlewares", "sluice", "forwardAuth", "trustForwardHeader"); v != false {
		t.Errorf("trustForwardHeader %v, want false", v)
	}
	if mws, _ := dig(doc, "http", "routers", "app", "middlewares").([]any); !slices.Contains(mws, any("sluice")) {
		t.Errorf("the router does not use the middleware: %v", mws)
	}
	if p.Settings.ForwardAuth.Proxy != "traefik" || len(p.Settings.TrustedProxies) == 0 {
		t.Errorf("the policy's forward_auth %+v, trusted_proxies %v", p.Settings.ForwardAuth, p.Settings.TrustedProxies)
	}
	l, _ := startServe(t, "--config", recipePolicy(t, "traefik"))
	askAsTraefik(t, l.API, 20, 10)
}

// askAsTraefik asks forward auth at addr as Traefik's ForwardAuth does,
// for one client until it is refused, then for another.
func askAsTraefik(t *testing.T, addr string, burst int, perSecond float64) {
	t.Helper()
	ask := func(client string) answer {
		return get(t, "http://"+addr+"/v1/auth", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/orders?id=7",
			"X-Forwarded-Host", "app.example.com", "X-Forwarded-For", client, "X-Forwarded-Proto", "http")
	}
	_, last := untilLimited(t, burst, perSecond, func() answer { return ask("192.0.2.7") }, is429)
	wantRefusal(t, last, "per-ip")
	if a := ask("192.0.2.8"); a.status != http.StatusOK {
		t.Errorf("another client: %d %q", a.status, a.body)
	}
}

// checkRecipeEnvoyBootstrap reads the Envoy recipe as Envoy does (a v3
// Bootstrap, every field validated) and checks that its rate limit filter
// asks the policy's domain of the cluster at the policy's grpc_listen,
// with the descriptor the policy keys by.
func checkRecipeEnvoyBootstrap(t *testing.T, path string) {
	var doc any
	if err := yaml.Unmarshal([]byte(recipeFile(t, "envoy", "envoy.yaml")), &doc); err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(mustJSON(t, doc), &b); err != nil {
		t.Fatalf("%s is not a valid Envoy bootstrap: %v", path, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", path, err)
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
	srv := serverSettings(t, filepath.Join(recipesDir, "envoy", "policy.yaml"))
	pol := recipeFile(t, "envoy", "policy.yaml")
	if !strings.Contains(pol, "match: {domain: "+rl.Domain+"}") {
		t.Errorf("the filter asks domain %q, which the policy's rule does not match", rl.Domain)
	}
	cluster := rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	var port uint32
	for _, c := range b.StaticResources.Clusters {
		if c.Name == cluster {
			port = c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address.GetSocketAddress().GetPortValue()
		}
	}
	if _, want, _ := net.SplitHostPort(srv.GRPCListen); strconv.Itoa(int(port)) != want {
		t.Errorf("the filter's cluster %q is on port %d, the policy's grpc_listen %s", cluster, port, srv.GRPCListen)
	}
	actions := m.GetRouteConfig().VirtualHosts[0].Routes[0].GetRoute().RateLimits[0].Actions
	if len(actions) != 1 || actions[0].GetRemoteAddress() == nil || !strings.Contains(pol, `"descriptor:remote_address"`) {
		t.Errorf("the route's descriptor %v is not the remote_address the policy keys by", actions)
	}
	if !m.GetUseRemoteAddress().GetValue() {
		t.Error("use_remote_address is off: Envoy would take the client from X-Forwarded-For")
	}
}

// TestRecipeEnvoy checks the Envoy recipe's config (no Envoy here), then
// asks sluice serve on its policy over gRPC as that config makes Envoy
// ask: one client's burst, OVER_LIMIT, another client still OK.
func TestRecipeEnvoy(t *testing.T) {
	checkRecipeEnvoyBootstrap(t, filepath.Join(recipesDir, "envoy", "envoy.yaml"))
	addr := proxytest.FreeAddr(t)
	startServe(t, "--config", recipePolicy(t, "envoy"), "--grpc-listen", addr)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rls := rlspb.NewRateLimitServiceClient(cc)
	ask := func(client string) answer {
		resp, err := rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: client}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		switch resp.OverallCode {
		case rlspb.RateLimitResponse_OK:
			return answer{status: http.StatusOK}
		case rlspb.RateLimitResponse_OVER_LIMIT:
			return answer{status: http.StatusTooManyRequests}
		}
		return answer{status: 0, body: resp.String()}
	}
	untilLimited(t, 20, 10, func() answer { return ask("192.0.2.7") }, is429)
	if a := ask("192.0.2.8"); a.status != http.StatusOK {
		t.Errorf("another client: %v", a)
	}
}

// TestRecipeJWTPlans runs the JWT recipe (sluice as the reverse proxy):
// a free user's burst is 10, a pro user's 100, and a token that does not
// verify (another secret) shares the one bucket of requests without one.
func TestRecipeJWTPlans(t *testing.T) {
	const secret = "recipe-secret-0123456789abcdef0123"
	t.Setenv("SLUICE_JWT_SECRET", secret)
	app, _ := recipeApp(t, nil)
	l, _ := startServe(t, "--config", recipePolicy(t, "jwt-plans", [2]string{"http://127.0.0.1:3000", app.URL}), "--proxy-listen", "127.0.0.1:0")
	token := func(key, sub, plan string) string {
		claims := jwt.MapClaims{"sub": sub, "iss": "https://auth.example.com", "aud": "api.example.com", "exp": time.Now().Add(time.Hour).Unix()}
		if plan != "" {
			claims["plan"] = plan
		}
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(key))
		if err != nil {
			t.Fatal(err)
		}
		return "Bearer " + s
	}
	as := func(auth string) func() answer {
		return func() answer { return get(t, "http://"+l.Proxy+"/v1/items", "Authorization", auth) }
	}
	_, last := untilLimited(t, 10, 1, as(token(secret, "alice", "")), is429)
	wantRefusal(t, last, "per-user.free")
	_, last = untilLimited(t, 100, 10, as(token(secret, "bob", "pro")), is429)
	wantRefusal(t, last, "per-user.pro")
	_, last = untilLimited(t, 10, 1, as(token("forged-secret-0123456789abcdef0123", "mallory", "pro")), is429)
	wantRefusal(t, last, "per-user.free")
	if a := get(t, "http://"+l.Proxy+"/v1/items"); a.status != http.StatusTooManyRequests {
		t.Errorf("a request without a token after the forged ones: %d, want the shared bucket's 429", a.status)
	}
}

// TestRecipeAPIKeyRedis runs the fleet recipe: two sluice serve (reverse
// proxies) on one real Redis enforce one burst of 100 per key between
// them.
func TestRecipeAPIKeyRedis(t *testing.T) {
	redisAddr := redistest.Server(t)
	app, hits := recipeApp(t, nil)
	// Long client deadlines, so that a loaded machine does not turn store
	// calls into on_store_error admissions (see TestServeRedisFleet).
	cfg := recipePolicy(t, "api-key-redis",
		[2]string{"redis://127.0.0.1:6379/0", "redis://" + redisAddr + "/0?timeout=10s&dial_timeout=30s&write_timeout=30s"},
		[2]string{"http://127.0.0.1:3000", app.URL})
	a, _ := startServe(t, "--config", cfg, "--proxy-listen", "127.0.0.1:0")
	b, _ := startServe(t, "--config", cfg, "--proxy-listen", "127.0.0.1:0")
	n := 0
	passed, last := untilLimited(t, 100, 1000.0/60, func() answer {
		n++
		proxy := a.Proxy
		if n%2 == 0 {
			proxy = b.Proxy
		}
		return get(t, "http://"+proxy+"/v1/items", "X-Api-Key", "key-1")
	}, is429)
	wantRefusal(t, last, "per-api-key")
	if hits.Load() != int64(passed) {
		t.Errorf("the app saw %d requests, want the %d admitted", hits.Load(), passed)
	}
	if c := get(t, "http://"+a.Proxy+"/v1/items", "X-Api-Key", "key-2"); c.status != http.StatusOK {
		t.Errorf("another key: %d", c.status)
	}
}

// TestRecipeLLMGateway runs the LLM gateway recipe: a request is admitted
// on its max_tokens and settled at the usage the upstream reports. A key
// whose request used its whole estimate is refused the next one; a key
// whose request used little gets the rest back and is admitted again.
func TestRecipeLLMGateway(t *testing.T) {
	app, hits := recipeApp(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[],"usage":{"total_tokens":%s}}`, r.URL.Query().Get("used"))
	})
	l, _ := startServe(t, "--config", recipePolicy(t, "llm-gateway", [2]string{"http://127.0.0.1:3000", app.URL}), "--proxy-listen", "127.0.0.1:0")
	complete := func(key string, maxTokens, used int) answer {
		req, _ := http.NewRequest(http.MethodPost, "http://"+l.Proxy+"/v1/chat/completions?used="+strconv.Itoa(used),
			strings.NewReader(fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[]}`, maxTokens)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Api-Key", key)
		return send(t, req)
	}
	if a := complete("key-1", 90000, 90000); a.status != http.StatusOK {
		t.Fatalf("first request: %d %q", a.status, a.body)
	}
	// 10,000 tokens left, refilling 100,000 a minute: a second estimate
	// of 90,000 fits only once 48 s have passed.
	start := time.Now()
	if a := complete("key-1", 90000, 10); a.status != http.StatusTooManyRequests && time.Since(start) < 48*time.Second {
		t.Fatalf("second request: %d %q, want 429", a.status, a.body)
	} else if a.status == http.StatusTooManyRequests {
		wantRefusal(t, a, "tokens-per-key")
	}

	if a := complete("key-2", 90000, 500); a.status != http.StatusOK {
		t.Fatalf("key-2's first request: %d %q", a.status, a.body)
	}
	// The settlement lands after the response: wait for it (bounded).
	for deadline := time.Now().Add(30 * time.Second); ; {
		d := peek(t, l.API, `{"rule":"tokens-per-key","key":"key-2"}`)
		if r, _ := d["remaining"].(float64); r >= 99000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key-2 was not refunded: %v", d)
		}
		time.Sleep(10 * time.Millisecond) // waiting for the settlement, not for tokens
	}
	if a := complete("key-2", 90000, 500); a.status != http.StatusOK {
		t.Fatalf("key-2 after its refund: %d %q", a.status, a.body)
	}
	if hits.Load() != 3 {
		t.Errorf("the upstream saw %d requests, want the 3 admitted", hits.Load())
	}
}

// TestRecipeLogin runs the login recipe (sluice as the reverse proxy):
// 5 attempts per user name however /login is spelled, other names still
// served, page loads never limited, and 20 attempts per address in all.
func TestRecipeLogin(t *testing.T) {
	app, _ := recipeApp(t, nil)
	l, _ := startServe(t, "--config", recipePolicy(t, "login", [2]string{"http://127.0.0.1:3000", app.URL}), "--proxy-listen", "127.0.0.1:0")
	login := func(path, user string) answer {
		req, _ := http.NewRequest(http.MethodPost, "http://"+l.Proxy+path+"?user="+user, strings.NewReader("password=guess"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		return send(t, req)
	}
	tries := 0
	passed, last := untilLimited(t, 5, 5.0/900, func() answer { tries++; return login("/login", "alice") }, is429)
	wantRefusal(t, last, "login-per-user")
	for _, p := range []string{"/LOGIN", "/login/", "/x/../login", "/login;jsessionid=1"} {
		if a := login(p, "alice"); a.status != http.StatusTooManyRequests {
			t.Errorf("POST %s?user=alice after the limit: %d", p, a.status)
		}
	}
	for i := 0; i < 3; i++ {
		if a := get(t, "http://"+l.Proxy+"/login"); a.status != http.StatusOK {
			t.Fatalf("GET /login: %d", a.status)
		}
	}
	// Refused attempts are charged to no rule: the address has spent
	// passed of its 20.
	users := 0
	_, last = untilLimited(t, 20-passed, 20.0/60, func() answer { users++; return login("/login", "user"+strconv.Itoa(users)) }, is429)
	wantRefusal(t, last, "login-per-ip")
}

// TestRecipeThirdPartyQuota runs the quota recipe on the decision API: a
// window's 100 calls, then a refusal that says to come back after the
// window ends, later by an offset fixed per key.
func TestRecipeThirdPartyQuota(t *testing.T) {
	l, _ := startServe(t, "--config", recipePolicy(t, "third-party-quota"))
	var waits []float64
	for k := 0; len(waits) < 5 && k < 50; k++ {
		key := fmt.Sprintf(`"key":"token-%d"`, k)
		minute := time.Now().Truncate(time.Minute)
		if d := take(t, l.API, `{"rule":"partner-api",`+key+`,"cost":100}`); d["allowed"] != true {
			t.Fatalf("a fresh window's 100 calls: %v", d)
		}
		d := take(t, l.API, `{"rule":"partner-api",`+key+`}`)
		if d["allowed"] == true {
			if time.Now().Truncate(time.Minute).Equal(minute) {
				t.Fatalf("call 101 in one window admitted: %v", d)
			}
			continue // a new window began between the two: try another key
		}
		ms, _ := d["retry_after_ms"].(float64)
		if ms <= 0 || ms > 70000 {
			t.Fatalf("retry_after_ms %v, want up to the window's end (60 s) plus the jitter (10 s)", d["retry_after_ms"])
		}
		// What is left of the minute, plus the key's offset.
		waits = append(waits, ms-float64(time.Until(minute.Add(time.Minute)).Milliseconds()))
	}
	if len(waits) < 5 {
		t.Fatalf("only %d keys were refused within one window", len(waits))
	}
	slices.Sort(waits)
	if waits[len(waits)-1]-waits[0] < 100 {
		t.Errorf("the keys' offsets past the window %v are all alike: no jitter", waits)
	}
}

// checkRecipeKubernetesIngress: the Middleware asks the Service of
// examples/kubernetes/ for /v1/auth, without trusting the client's
// forwarding headers, and the Ingress names that Middleware.
func checkRecipeKubernetesIngress(t *testing.T, path string) {
	docs := readYAML(t, path)
	var mw, ing map[string]any
	for _, d := range docs {
		switch d["kind"] {
		case "Middleware":
			mw = d
		case "Ingress":
			ing = d
		}
	}
	if mw == nil || ing == nil {
		t.Fatalf("%s: want a Middleware and an Ingress", path)
	}
	svc := kubernetesDoc(t, filepath.Join(examplesDir, "kubernetes", "service.yaml"), "Service")
	name, _ := dig(svc, "metadata", "name").(string)
	port := dig(svc, "spec", "ports", 0, "port")
	ns, _ := dig(mw, "metadata", "namespace").(string)
	if a := dig(mw, "spec", "forwardAuth", "address"); a != fmt.Sprintf("http://%s.%s.svc:%v/v1/auth", name, ns, port) {
		t.Errorf("forwardAuth.address %v is not the Service %s:%v's /v1/auth", a, name, port)
	}
	if v := dig(mw, "spec", "forwardAuth", "trustForwardHeader"); v != false {
		t.Errorf("trustForwardHeader %v, want false", v)
	}
	ref := fmt.Sprintf("%s-%s@kubernetescrd", ns, dig(mw, "metadata", "name"))
	if a := dig(ing, "metadata", "annotations", "traefik.ingress.kubernetes.io/router.middlewares"); a != ref {
		t.Errorf("the Ingress names middleware %v, want %s", a, ref)
	}
}

// TestRecipeKubernetes: the policy for the ConfigMap names Traefik and
// trusts the pod network, and listens where the Service sends traffic.
func TestRecipeKubernetes(t *testing.T) {
	checkRecipeKubernetesIngress(t, filepath.Join(recipesDir, "kubernetes", "ingress.yaml"))
	p, err := policy.Load(filepath.Join(recipesDir, "kubernetes", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Settings.ForwardAuth.Proxy != "traefik" || len(p.Settings.TrustedProxies) == 0 {
		t.Errorf("forward_auth %+v, trusted_proxies %v: both are needed", p.Settings.ForwardAuth, p.Settings.TrustedProxies)
	}
	svc := kubernetesDoc(t, filepath.Join(examplesDir, "kubernetes", "service.yaml"), "Service")
	listen := serverSettings(t, filepath.Join(recipesDir, "kubernetes", "policy.yaml")).Listen
	if _, port, _ := net.SplitHostPort(listen); fmt.Sprint(dig(svc, "spec", "ports", 0, "port")) != port {
		t.Errorf("listen %s is not the Service's port", listen)
	}
	// The deployment mounts the ConfigMap's policy.yaml key, the name the
	// recipe's kubectl create configmap gives the file.
	dep := recipeFileAt(t, filepath.Join(examplesDir, "kubernetes", "deployment.yaml"))
	if !strings.Contains(dep, "/etc/sluice/policy.yaml") {
		t.Error("examples/kubernetes/deployment.yaml no longer serves /etc/sluice/policy.yaml")
	}
}

func recipeFileAt(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
