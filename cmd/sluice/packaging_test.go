package main

// The files a platform team deploys sluice with: the Dockerfile and every
// file under examples/. Each is checked in its own format: sluice's
// configs with "sluice check", the others with a parser of theirs, never
// with sluice check. .ci/image builds the image the Dockerfile describes
// and runs it; .ci/run also gives the systemd unit to systemd-analyze.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/policy"
)

const examplesDir = "../../examples"

// sluiceConfigs are the examples that are sluice configurations (its own
// format or envoyproxy/ratelimit's): exactly these go to sluice check.
var sluiceConfigs = []string{"api.yaml", "global-rps.yaml", "policy.yaml", "ratelimit-config.yaml", "redis.yaml", "tiered.yaml", "llm-gateway.yaml"}

// exampleChecks checks every other example in its own format.
var exampleChecks = map[string]func(t *testing.T, path string){
	// Also read as a v3 Bootstrap, validated, by envoyrls/example_test.go.
	// Read as Envoy Gateway reads it, and its environment as serve does, by TestEnvoyGatewayExample.
	"envoy-gateway/envoy-gateway-config.yaml": func(t *testing.T, _ string) { TestEnvoyGatewayExample(t) },
	"envoy.yaml":   checkEnvoyExample,
	"traefik.yaml": checkTraefikExample,
	// Also run in a real nginx and a real Caddy by httpgate/nginx_test.go
	// and httpgate/caddy_test.go.
	"nginx.conf":                 checkBraces,
	"Caddyfile":                  checkBraces,
	"compose.yaml":               checkComposeExample,
	"systemd/sluice.service":     checkSystemdExample,
	"kubernetes/configmap.yaml":  checkKubernetesConfigMap,
	"kubernetes/deployment.yaml": checkKubernetesDeployment,
	"kubernetes/service.yaml":    checkKubernetesService,
	// Their metric names are also checked against a running sluice by
	// TestMonitoringMetricsExported (monitoring_test.go).
	"grafana/sluice.json":         checkGrafanaDashboard,
	"prometheus/alerts.yaml":      checkPrometheusAlerts,
	"prometheus/alerts.test.yaml": checkPromtoolTests,
}

// TestExamples checks each file under examples/, and fails on a file
// that nothing checks, so a new example cannot go untested.
func TestExamples(t *testing.T) {
	t.Setenv("SLUICE_JWT_SECRET", "0123456789abcdef0123456789abcdef")
	t.Setenv("SLUICE_API_TOKEN", "0123456789abcdef0123456789abcdef")
	var files []string
	err := filepath.WalkDir(examplesDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(examplesDir, path)
			files = append(files, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var configs []string
	for _, f := range files {
		path := filepath.Join(examplesDir, f)
		if slices.Contains(sluiceConfigs, f) {
			configs = append(configs, path)
			continue
		}
		check, ok := exampleChecks[f]
		if !ok {
			t.Errorf("examples/%s: no test checks it: add it to sluiceConfigs (a sluice config) or to exampleChecks", f)
			continue
		}
		t.Run(f, func(t *testing.T) { check(t, path) })
	}
	for _, f := range sluiceConfigs {
		if !slices.Contains(files, f) {
			t.Errorf("examples/%s is listed but missing", f)
		}
	}
	var out, errb bytes.Buffer
	if code := run(append([]string{"check"}, configs...), &out, &errb); code != 0 {
		t.Fatalf("sluice check %v: exit %d\n%s", configs, code, errb.String())
	}
	if n := strings.Count(out.String(), ": ok ("); n != len(sluiceConfigs) {
		t.Fatalf("sluice check said ok %d times for %d files:\n%s", n, len(sluiceConfigs), out.String())
	}
}

// readYAML decodes every document of a (multi-document) YAML file.
func readYAML(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	if len(docs) == 0 {
		t.Fatalf("%s: no YAML document", path)
	}
	return docs
}

// dig follows keys (string for maps, int for lists) into decoded YAML;
// nil when a step is missing.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func checkEnvoyExample(t *testing.T, path string) {
	docs := readYAML(t, path)
	clusters, _ := dig(docs[0], "static_resources", "clusters").([]any)
	for _, c := range clusters {
		if strings.Contains(string(mustJSON(t, c)), `"port_value":8081`) {
			return
		}
	}
	t.Errorf("%s: no cluster points at sluice's gRPC port 8081", path)
}

func checkTraefikExample(t *testing.T, path string) {
	docs := readYAML(t, path)
	mws, _ := dig(docs[0], "http", "middlewares").(map[string]any)
	for _, mw := range mws {
		if addr, _ := dig(mw, "forwardAuth", "address").(string); strings.Contains(addr, "/v1/auth") {
			return
		}
	}
	t.Errorf("%s: no forwardAuth middleware calls sluice's /v1/auth", path)
}

// checkBraces is a syntax check for nginx's and Caddy's formats: the
// blocks close, outside comments and quotes.
func checkBraces(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	depth := 0
	for i, line := range strings.Split(string(data), "\n") {
		quoted := false
		for _, r := range line {
			switch {
			case r == '"':
				quoted = !quoted
			case quoted:
			case r == '#':
				goto next
			case r == '{':
				depth++
			case r == '}':
				depth--
				if depth < 0 {
					t.Fatalf("%s:%d: } closes nothing", path, i+1)
				}
			}
		}
	next:
	}
	if depth != 0 {
		t.Fatalf("%s: %d blocks left open", path, depth)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkComposeExample: sluice, built from the Dockerfile, runs the mounted
// config, which is a valid sluice config on the compose file's Redis;
// Redis has a healthcheck that sluice waits for.
func checkComposeExample(t *testing.T, path string) {
	doc := readYAML(t, path)[0]
	services, _ := doc["services"].(map[string]any)
	if len(services) != 2 || services["sluice"] == nil || services["redis"] == nil {
		t.Fatalf("%s: want services sluice and redis, got %v", path, services)
	}
	redis, sl := services["redis"], services["sluice"]
	if img, _ := dig(redis, "image").(string); !strings.HasPrefix(img, "redis:") {
		t.Errorf("redis image %q", img)
	}
	if test, _ := dig(redis, "healthcheck", "test").([]any); len(test) < 2 || test[0] != "CMD" {
		t.Errorf("redis healthcheck.test %v, want an exec-form CMD", test)
	}
	for _, k := range []string{"interval", "timeout", "retries"} {
		if dig(redis, "healthcheck", k) == nil {
			t.Errorf("redis healthcheck lacks %s", k)
		}
	}
	if c := dig(sl, "depends_on", "redis", "condition"); c != "service_healthy" {
		t.Errorf("sluice depends_on.redis.condition %v, want service_healthy", c)
	}
	if img, _ := dig(sl, "image").(string); img == "" {
		t.Error("sluice has no image name")
	}
	ctx, _ := dig(sl, "build", "context").(string)
	df, _ := dig(sl, "build", "dockerfile").(string)
	if _, err := os.Stat(filepath.Join(filepath.Dir(path), ctx, df)); ctx == "" || df == "" || err != nil {
		t.Errorf("sluice build {context: %q, dockerfile: %q} names no Dockerfile (%v)", ctx, df, err)
	}
	ports, _ := dig(sl, "ports").([]any)
	var published []string
	for _, p := range ports {
		s, _ := p.(string)
		published = append(published, s)
		if !strings.HasPrefix(s, "127.0.0.1:") {
			t.Errorf("port %q is published beyond loopback", s)
		}
	}
	if !slices.ContainsFunc(published, func(s string) bool { return strings.HasSuffix(s, ":8080") }) {
		t.Errorf("ports %v do not publish 8080", published)
	}
	if u, _ := dig(sl, "user").(string); !regexp.MustCompile(`^[1-9][0-9]*:[0-9]+$`).MatchString(u) {
		t.Errorf("sluice user %q, want a numeric non-root uid:gid", u)
	}
	if ro, _ := dig(sl, "read_only").(bool); !ro {
		t.Error("sluice's file system is not read_only")
	}

	// The mounted config is the one --config names, and it is valid.
	cmd, _ := dig(sl, "command").([]any)
	i := slices.Index(cmd, any("--config"))
	if len(cmd) == 0 || cmd[0] != "serve" || i < 0 || i+1 >= len(cmd) {
		t.Fatalf("sluice command %v, want serve --config FILE", cmd)
	}
	target := cmd[i+1].(string)
	var host string
	vols, _ := dig(sl, "volumes").([]any)
	for _, v := range vols {
		parts := strings.Split(v.(string), ":")
		if len(parts) >= 2 && parts[1] == target {
			host = parts[0]
			if len(parts) < 3 || parts[2] != "ro" {
				t.Errorf("volume %q is not read-only", v)
			}
		}
	}
	if host == "" {
		t.Fatalf("no volume mounts %s (volumes %v)", target, vols)
	}
	cfg := filepath.Join(filepath.Dir(path), host)
	var out, errb bytes.Buffer
	if code := run([]string{"check", cfg}, &out, &errb); code != 0 {
		t.Fatalf("sluice check %s (mounted at %s): exit %d\n%s", cfg, target, code, errb.String())
	}
	srv := serverSettings(t, cfg)
	u, err := url.Parse(srv.StoreURL)
	if err != nil || u.Scheme != "redis" || services[u.Hostname()] == nil {
		t.Errorf("%s: store.url %q is not the compose file's Redis", cfg, srv.StoreURL)
	}
}

// unit is a systemd unit file: section -> key -> values (a key may repeat).
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u, section := unit{}, ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case strings.HasSuffix(line, "\\"):
			t.Fatalf("%s:%d: a continued line; keep each setting on one", path, n)
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			if u[section] != nil {
				t.Fatalf("%s:%d: section [%s] twice", path, n, section)
			}
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.TrimSpace(k) == "" {
				t.Fatalf("%s:%d: %q is neither a section nor KEY=VALUE in one", path, n, line)
			}
			k = strings.TrimSpace(k)
			u[section][k] = append(u[section][k], strings.TrimSpace(v))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

func checkSystemdExample(t *testing.T, path string) {
	u := parseUnit(t, path)
	for _, s := range []string{"Unit", "Service", "Install"} {
		if u[s] == nil {
			t.Fatalf("%s: no [%s] section", path, s)
		}
	}
	want := map[string]string{
		"Service.ExecReload":            "/bin/kill -HUP $MAINPID", // serve reloads its policy on SIGHUP
		"Service.Restart":               "on-failure",
		"Service.DynamicUser":           "yes",
		"Service.NoNewPrivileges":       "yes",
		"Service.ProtectSystem":         "strict",
		"Service.ProtectHome":           "yes",
		"Service.PrivateTmp":            "yes",
		"Service.CapabilityBoundingSet": "",
		"Install.WantedBy":              "multi-user.target",
	}
	for k, v := range want {
		section, key, _ := strings.Cut(k, ".")
		if got := u[section][key]; len(got) != 1 || got[0] != v {
			t.Errorf("%s: %s=%v, want %q", path, k, got, v)
		}
	}
	start := u["Service"]["ExecStart"]
	if len(start) != 1 {
		t.Fatalf("%s: ExecStart %v", path, start)
	}
	args := strings.Fields(start[0])
	if len(args) < 4 || !filepath.IsAbs(args[0]) || filepath.Base(args[0]) != "sluice" || args[1] != "serve" || args[2] != "--config" || !filepath.IsAbs(args[3]) {
		t.Errorf("%s: ExecStart=%s, want /ABS/sluice serve --config /ABS/FILE", path, start[0])
	}
}

func kubernetesDoc(t *testing.T, path, kind string) map[string]any {
	t.Helper()
	docs := readYAML(t, path)
	var found map[string]any
	for _, d := range docs {
		if d["apiVersion"] == nil || d["kind"] == nil || dig(d, "metadata", "name") == nil {
			t.Errorf("%s: a document lacks apiVersion, kind or metadata.name", path)
		}
		if d["kind"] == kind {
			found = d
		}
	}
	if found == nil {
		t.Fatalf("%s: no %s", path, kind)
	}
	return found
}

func checkKubernetesConfigMap(t *testing.T, path string) {
	cm := kubernetesDoc(t, path, "ConfigMap")
	data, _ := dig(cm, "data", "policy.yaml").(string)
	if data == "" {
		t.Fatalf("%s: no data.policy.yaml", path)
	}
	_, srv, err := policy.ParseConfig(path+" data.policy.yaml", []byte(data))
	if err != nil {
		t.Fatalf("the ConfigMap's policy:\n%v", err)
	}
	// In a pod, a loopback address would be unreachable through the Service.
	if srv.Listen != ":8080" || srv.GRPCListen != ":8081" {
		t.Errorf("the ConfigMap's policy listens on %q and %q, want :8080 and :8081 (the Service's ports)", srv.Listen, srv.GRPCListen)
	}
}

func checkKubernetesDeployment(t *testing.T, path string) {
	d := kubernetesDoc(t, path, "Deployment")
	pod := dig(d, "spec", "template", "spec")
	if dig(pod, "securityContext", "runAsNonRoot") != true {
		t.Error("pod securityContext.runAsNonRoot is not true")
	}
	if uid, _ := dig(pod, "securityContext", "runAsUser").(int); uid == 0 {
		t.Error("pod securityContext.runAsUser is not a non-root uid")
	}
	c := dig(pod, "containers", 0)
	if dig(c, "securityContext", "readOnlyRootFilesystem") != true || dig(c, "securityContext", "allowPrivilegeEscalation") != false {
		t.Error("container securityContext: want readOnlyRootFilesystem true, allowPrivilegeEscalation false")
	}
	if dig(c, "resources", "requests", "cpu") == nil || dig(c, "resources", "requests", "memory") == nil || dig(c, "resources", "limits", "memory") == nil {
		t.Error("container resources lack cpu/memory requests or a memory limit")
	}
	for probe, want := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if got := dig(c, probe, "httpGet", "path"); got != want {
			t.Errorf("%s path %v, want %s", probe, got, want)
		}
		if got := dig(c, probe, "httpGet", "port"); got != "http" {
			t.Errorf("%s port %v, want the http port", probe, got)
		}
	}
	ports := map[string]int{}
	for i := 0; dig(c, "ports", i) != nil; i++ {
		name, _ := dig(c, "ports", i, "name").(string)
		ports[name], _ = dig(c, "ports", i, "containerPort").(int)
	}
	if ports["http"] != 8080 || ports["grpc"] != 8081 {
		t.Errorf("container ports %v, want http 8080 and grpc 8081", ports)
	}
	// serve reads the ConfigMap's file through a directory mount (a subPath
	// mount would never see an update).
	args := strings.Join(anyStrings(dig(c, "args")), " ")
	mount := dig(c, "volumeMounts", 0)
	if dir, _ := dig(mount, "mountPath").(string); args != "serve --config "+dir+"/policy.yaml" || dig(mount, "subPath") != nil {
		t.Errorf("args %q and mount %v: want serve --config MOUNT/policy.yaml, without subPath", args, mount)
	}
	cm := kubernetesDoc(t, filepath.Join(filepath.Dir(path), "configmap.yaml"), "ConfigMap")
	if got, want := dig(pod, "volumes", 0, "configMap", "name"), dig(cm, "metadata", "name"); got != want {
		t.Errorf("the volume mounts ConfigMap %v, want %v", got, want)
	}
}

func checkKubernetesService(t *testing.T, path string) {
	s := kubernetesDoc(t, path, "Service")
	ports := map[string]string{}
	for i := 0; dig(s, "spec", "ports", i) != nil; i++ {
		p := dig(s, "spec", "ports", i)
		port, _ := dig(p, "port").(int)
		target, _ := dig(p, "targetPort").(string)
		ports[target] = strconv.Itoa(port)
	}
	if ports["http"] != "8080" || ports["grpc"] != "8081" {
		t.Errorf("service ports by target %v, want http 8080 and grpc 8081", ports)
	}
	d := kubernetesDoc(t, filepath.Join(filepath.Dir(path), "deployment.yaml"), "Deployment")
	labels := dig(d, "spec", "template", "metadata", "labels").(map[string]any)
	sel, _ := dig(s, "spec", "selector").(map[string]any)
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("the selector %s=%v does not match the pods' labels %v", k, v, labels)
		}
	}
	if len(sel) == 0 {
		t.Error("the Service has no selector")
	}
}

func anyStrings(v any) []string {
	l, _ := v.([]any)
	s := make([]string, len(l))
	for i, x := range l {
		s[i], _ = x.(string)
	}
	return s
}

// dockerInstruction is one instruction of a Dockerfile, continuation
// lines joined.
type dockerInstruction struct {
	line      int
	cmd, args string
}

func parseDockerfile(t *testing.T, path string) [][]dockerInstruction {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]dockerInstruction
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if body, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		in := dockerInstruction{start, strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		} else if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("%s:%d: %s before FROM", path, in.line, in.cmd)
			}
			continue
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	return stages
}

// TestDockerfile checks what the Dockerfile promises: a static binary
// built without the build machine's paths and with go-control-plane's
// generated marshalling (-tags vtprotobuf), on a base with no shell, run
// as a numeric non-root user, /sluice serve by default. .ci/image builds
// this image (reading ENTRYPOINT, CMD, USER and EXPOSE from the file)
// and runs it.
func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t, "../../Dockerfile")
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a build stage and a final one", len(stages))
	}
	last := func(stage []dockerInstruction, cmd string) (dockerInstruction, int) {
		n, found := 0, dockerInstruction{}
		for _, in := range stage {
			if in.cmd == cmd {
				found, n = in, n+1
			}
		}
		return found, n
	}
	var built bool
	for _, st := range stages[:len(stages)-1] {
		for _, in := range st {
			if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
				built = true
				for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-tags vtprotobuf", "./cmd/sluice"} {
					if !strings.Contains(in.args, want) {
						t.Errorf("line %d: the go build lacks %s", in.line, want)
					}
				}
			}
		}
	}
	if !built {
		t.Error("no build stage runs go build")
	}
	final := stages[len(stages)-1]
	base := final[0].args
	if !(strings.HasPrefix(base, "gcr.io/distroless/static") && strings.Contains(base, ":nonroot")) && base != "scratch" {
		t.Errorf("final base %q, want distroless/static:nonroot or scratch", base)
	}
	if in, n := last(final, "RUN"); n > 0 {
		t.Errorf("line %d: RUN in the final stage, which has no shell", in.line)
	}
	if in, n := last(final, "HEALTHCHECK"); n > 0 {
		t.Errorf("line %d: HEALTHCHECK needs a shell or an HTTP client the image lacks", in.line)
	}
	if in, _ := last(final, "COPY"); !strings.HasPrefix(in.args, "--from=") || !strings.HasSuffix(in.args, " /sluice") {
		t.Errorf("final COPY %q, want the built binary at /sluice", in.args)
	}
	user, _ := last(final, "USER")
	uid, gid, _ := strings.Cut(user.args, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("USER %q, want a numeric non-root uid", user.args)
	}
	if _, err := strconv.Atoi(gid); gid != "" && err != nil {
		t.Errorf("USER %q, want a numeric gid", user.args)
	}
	for cmd, want := range map[string][]string{"ENTRYPOINT": {"/sluice"}, "CMD": {"serve"}} {
		in, _ := last(final, cmd)
		var got []string
		if err := json.Unmarshal([]byte(in.args), &got); err != nil || !slices.Equal(got, want) {
			t.Errorf("%s %s, want the exec form %q", cmd, in.args, want)
		}
	}
	expose, _ := last(final, "EXPOSE")
	if got := strings.Fields(expose.args); !slices.Equal(got, []string{"8080", "8081"}) {
		t.Errorf("EXPOSE %v, want 8080 8081", got)
	}

	// .ci/image builds the binary the way the Dockerfile does.
	script, err := os.ReadFile("../../.ci/image")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-tags vtprotobuf", "./cmd/sluice", "Dockerfile"} {
		if !bytes.Contains(script, []byte(want)) {
			t.Errorf(".ci/image lacks %s", want)
		}
	}
	// The build context keeps the sources and leaves out the repository.
	ignore, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(ignore), "\n") {
		switch strings.TrimSpace(line) {
		case "go.mod", "go.sum", "cmd", "*.go", "**/*.go":
			t.Errorf(".dockerignore leaves out %s, which the build needs", line)
		}
	}
}

// TestExamplesRunLinesAndLoopback: every example shows how to run it, and
// every sluice configuration among them binds loopback unless it says why
// it binds every interface.
func TestExamplesRunLinesAndLoopback(t *testing.T) {
	run := regexp.MustCompile(`(?m)(^\s*(#|//).*|"description": ".*)\b(sluice (serve|check|simulate)|kubectl apply|docker compose|systemctl|promtool|caddy run|nginx (-p \S+ )?-c|envoy -c|traefik --|go (run|test)|Import)\b`)
	err := filepath.WalkDir(examplesDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !run.Match(data) {
			t.Errorf("%s: no run line (a comment showing how to run it)", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_JWT_SECRET", "0123456789abcdef0123456789abcdef")
	t.Setenv("SLUICE_API_TOKEN", "0123456789abcdef0123456789abcdef")
	t.Setenv("SLUICE_ADMIN_TOKEN", "0123456789abcdef0123456789abcdef")
	for _, name := range sluiceConfigs {
		path := filepath.Join(examplesDir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		cf := newConfigFile(path)
		if _, err := cf.ParseData(data); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		srv := cf.Server()
		if strings.Contains(string(data), "# Every interface, because") {
			continue
		}
		for field, addr := range map[string]string{"listen": srv.Listen, "grpc_listen": srv.GRPCListen, "api_listen": srv.APIListen, "proxy.listen": srv.ProxyListen} {
			if addr != "" && !loopback(addr) && !(name == "ratelimit-config.yaml" && field != "proxy.listen") {
				t.Errorf("%s: %s %q binds every interface, and the file does not say why (\"# Every interface, because ...\")", path, field, addr)
			}
		}
	}
}
