package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice"
)

// MaxFileSize bounds a configuration file.
const MaxFileSize = 4 << 20

// Load reads and compiles the configuration file at path. On failure the
// error is a *Errors listing every problem.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Errors{List: []error{&Error{File: path, Msg: err.Error()}}}
	}
	return Parse(path, data)
}

// Parse compiles a configuration given as bytes, YAML or JSON (JSON is
// read as the YAML it also is). filename names it in errors, and relative
// paths in it (PEM and JWKS files) are resolved against its directory.
// On failure the error is a *Errors listing every problem, in line order.
func Parse(filename string, data []byte) (*Policy, error) {
	return parse(filename, data, os.Getenv, readKeyFile)
}

// maxKeyFile bounds PEM and JWKS files.
const maxKeyFile = 1 << 20

// readKeyFile reads a PEM or JWKS file: a regular file of bounded size, so
// a config naming a device or a huge file fails instead of hanging.
func readKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err == nil && len(data) > maxKeyFile {
		err = fmt.Errorf("%s is larger than %d bytes", path, maxKeyFile)
	}
	return data, err
}

// DefaultGRPCPort is the Envoy rate limit service's port when grpc_listen
// is not set (the reference server's).
const DefaultGRPCPort = "8081"

// DefaultGRPCListen is grpc_listen's default for a given listen: the same
// host with port 8081 (port 0, any free port, when listen's is 0). The
// gRPC service is as private as the decision API: loopback when listen is
// loopback, every interface only when listen is. It grants no more than
// the decision API does (either can charge any key; refunds over gRPC
// need allow_negative_hits), so it is never more exposed than the service
// the operator already opened.
func DefaultGRPCListen(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return net.JoinHostPort("127.0.0.1", DefaultGRPCPort)
	}
	if port != "0" {
		port = DefaultGRPCPort
	}
	return net.JoinHostPort(host, port)
}

// DefaultYAML is the embedded policy that sluice serve runs without a
// config: one per-IP token bucket of 10 rps, burst 20, on the memory store.
const DefaultYAML = `# sluice's embedded default policy
listen: ":8080"
store:
  url: "memory://"
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm: token_bucket
    algorithm_config:
      rps: 10
      burst: 20
`

// Default returns the embedded default policy (DefaultYAML).
func Default() *Policy {
	p, err := Parse("embedded default", []byte(DefaultYAML))
	if err != nil {
		panic("policy: the embedded default is invalid: " + err.Error())
	}
	p.Source = "embedded default"
	return p
}

// loader holds the state of one parse: the problems found so far.
type loader struct {
	file     string
	dir      string
	getenv   func(string) string
	readFile func(string) ([]byte, error)
	errs     []*Error
	warns    []*Error   // settings that load but deserve a second look
	usesJWT  *yaml.Node // the first jwt: source, to locate "no jwt section"
	jwtPath  string
}

func (l *loader) errf(n *yaml.Node, path, format string, args ...any) {
	l.errs = append(l.errs, l.at(n, path, format, args...))
}

// warnf records a warning: the file loads, but the setting deserves a
// second look.
func (l *loader) warnf(n *yaml.Node, path, format string, args ...any) {
	l.warns = append(l.warns, l.at(n, path, format, args...))
}

func (l *loader) at(n *yaml.Node, path, format string, args ...any) *Error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &Error{File: l.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)}
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func parse(filename string, data []byte, getenv func(string) string, readFile func(string) ([]byte, error)) (*Policy, error) {
	l := &loader{file: filename, dir: filepath.Dir(filename), getenv: getenv, readFile: readFile}
	p := l.load(data)
	if len(l.errs) > 0 {
		sort.SliceStable(l.errs, func(i, j int) bool { return l.errs[i].Line < l.errs[j].Line })
		es := &Errors{List: make([]error, len(l.errs))}
		for i, e := range l.errs {
			es.List[i] = e
		}
		return nil, es
	}
	sort.SliceStable(l.warns, func(i, j int) bool { return l.warns[i].Line < l.warns[j].Line })
	for _, w := range l.warns {
		p.Warnings = append(p.Warnings, w.Error())
	}
	return p, nil
}

func (l *loader) load(data []byte) *Policy {
	if len(data) > MaxFileSize {
		l.errf(nil, "", "the file is larger than %d bytes", MaxFileSize)
		return nil
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			l.errf(nil, "", "the file is empty")
			return nil
		}
		l.syntaxError(err)
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		l.errf(&extra, "", "the file holds more than one YAML document")
	} else if !errors.Is(err, io.EOF) {
		l.syntaxError(err)
	}
	if len(doc.Content) == 0 {
		l.errf(nil, "", "the file is empty")
		return nil
	}
	return l.policy(doc.Content[0])
}

func (l *loader) syntaxError(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		l.errs = append(l.errs, &Error{File: l.file, Line: line, Msg: "syntax error: " + m[2]})
		return
	}
	l.errs = append(l.errs, &Error{File: l.file, Msg: "syntax error: " + msg})
}

// obj is a mapping node whose keys have been checked against the fields
// its schema allows.
type obj struct {
	l    *loader
	n    *yaml.Node
	path string
	vals map[string]*yaml.Node
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// deref follows aliases (bounded, since an alias cannot refer to itself).
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 64; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// object checks that n is a mapping whose keys are all in allowed (nil
// allows any key) and unique. It returns nil when n is not a mapping.
func (l *loader) object(n *yaml.Node, path string, allowed []string) *obj {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		l.errf(n, path, "must be a mapping of fields (got %s)", kindName(n))
		return nil
	}
	o := &obj{l: l, n: n, path: path, vals: map[string]*yaml.Node{}}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			l.errf(k, path, "field names must be plain strings")
			continue
		}
		name := k.Value
		if _, dup := o.vals[name]; dup {
			l.errf(k, join(path, name), "appears twice")
			continue
		}
		if allowed != nil && !contains(allowed, name) {
			msg := "unknown field"
			if s := suggest(name, allowed); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			} else {
				msg += " (known: " + strings.Join(allowed, ", ") + ")"
			}
			l.errf(k, join(path, name), "%s", msg)
			continue
		}
		o.vals[name] = v
	}
	return o
}

// has reports whether the mapping sets field name (validly or not).
func (o *obj) has(name string) bool { _, ok := o.vals[name]; return ok }

func (o *obj) str(name string) (string, *yaml.Node, bool) {
	n, ok := o.vals[name]
	if !ok {
		return "", nil, false
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		o.l.errf(n, join(o.path, name), "must be a string (got %s)", kindName(n))
		return "", n, false
	}
	return n.Value, n, true
}

func (o *obj) num(name string) (float64, *yaml.Node, bool) {
	n, ok := o.vals[name]
	if !ok {
		return 0, nil, false
	}
	f, ok := o.l.number(n, join(o.path, name))
	return f, n, ok
}

func (l *loader) number(n *yaml.Node, path string) (float64, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		l.errf(n, path, "must be a number (got %s)", kindName(n))
		return 0, false
	}
	var f float64
	if err := n.Decode(&f); err != nil {
		l.errf(n, path, "must be a number: %v", err)
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		l.errf(n, path, "must be a finite number")
		return 0, false
	}
	return f, true
}

func (o *obj) integer(name string) (int, *yaml.Node, bool) {
	f, n, ok := o.num(name)
	if !ok {
		return 0, n, false
	}
	if f != math.Trunc(f) || math.Abs(f) > 1<<31 {
		o.l.errf(n, join(o.path, name), "must be a whole number")
		return 0, n, false
	}
	return int(f), n, true
}

func (o *obj) boolean(name string) (bool, *yaml.Node, bool) {
	n, ok := o.vals[name]
	if !ok {
		return false, nil, false
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		o.l.errf(n, join(o.path, name), "must be true or false (got %s)", kindName(n))
		return false, n, false
	}
	var b bool
	if err := n.Decode(&b); err != nil {
		o.l.errf(n, join(o.path, name), "must be true or false")
		return false, n, false
	}
	return b, n, true
}

func (o *obj) duration(name string) (time.Duration, *yaml.Node, bool) {
	if n, ok := o.vals[name]; ok && n.Kind == yaml.ScalarNode && (n.Tag == "!!int" || n.Tag == "!!float") {
		o.l.errf(n, join(o.path, name), "must be a duration with a unit, such as \"%ss\" (got the number %s)", n.Value, n.Value)
		return 0, n, false
	}
	s, n, ok := o.str(name)
	if !ok {
		return 0, n, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		o.l.errf(n, join(o.path, name), "must be a duration such as \"1m\" or \"500ms\" (got %q)", s)
		return 0, n, false
	}
	return d, n, true
}

// list returns the items of a sequence field.
func (o *obj) list(name string) ([]*yaml.Node, *yaml.Node, bool) {
	n, ok := o.vals[name]
	if !ok {
		return nil, nil, false
	}
	if n.Kind != yaml.SequenceNode {
		o.l.errf(n, join(o.path, name), "must be a list (got %s)", kindName(n))
		return nil, n, false
	}
	items := make([]*yaml.Node, len(n.Content))
	for i, it := range n.Content {
		items[i] = deref(it)
	}
	return items, n, true
}

// strings returns a list of strings; bad items are reported and skipped.
func (o *obj) strList(name string) ([]string, []*yaml.Node, bool) {
	items, _, ok := o.list(name)
	if !ok {
		return nil, nil, false
	}
	var out []string
	var nodes []*yaml.Node
	for i, it := range items {
		if it.Kind != yaml.ScalarNode || it.Tag != "!!str" {
			o.l.errf(it, fmt.Sprintf("%s[%d]", join(o.path, name), i), "must be a string (got %s)", kindName(it))
			continue
		}
		out = append(out, it.Value)
		nodes = append(nodes, it)
	}
	return out, nodes, true
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "nothing"
		case "!!str":
			return fmt.Sprintf("the string %q", clip(n.Value))
		case "!!int", "!!float":
			return "the number " + clip(n.Value)
		case "!!bool":
			return n.Value
		}
		return clip(n.Value)
	}
	return "an unsupported value"
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// suggest returns the allowed name closest to a typo, if close enough.
func suggest(name string, allowed []string) string {
	best, bestD := "", 3
	name = strings.ToLower(name)
	for _, a := range allowed {
		// The distance is at least the difference in length: most
		// candidates are ruled out without the quadratic comparison.
		if abs(len(a)-len(name)) >= bestD {
			continue
		}
		// A short name is a few edits from every other short name.
		if d := editDistance(name, strings.ToLower(a)); d < bestD && d < len(name) {
			best, bestD = a, d
		}
	}
	return best
}

func abs(n int) int { return max(n, -n) }

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

var topFields = []string{"listen", "grpc_listen", "store", "admin_token_env", "trusted_proxies", "jwt", "proxy", "headers", "deny_status", "audit_log", "ipv6_prefix", "missing_key", "rules", "rules_table", "grpc_tls", "allow_negative_hits", "api_listen", "api_token_env", "server", "forward_auth"}

func (l *loader) policy(root *yaml.Node) *Policy {
	o := l.object(root, "", topFields)
	if o == nil {
		return nil
	}
	p := &Policy{Source: l.file, byName: map[string]*Rule{}, limits: map[string]*sluice.Limit{}}
	s := &p.Settings
	s.Listen, s.GRPCListen, s.StoreURL = ":8080", ":8081", "memory://"
	s.Headers = []string{"draft", "trio"}
	s.DenyStatus, s.IPv6Prefix = 429, 64
	s.Server = DefaultServerLimits

	addrs := map[string]string{}
	listenAt := func(field string, dst *string, allowEmpty bool) bool {
		v, n, ok := o.str(field)
		switch {
		case !ok:
			return n == nil // absent: the default stands
		case v == "" && allowEmpty:
			*dst = ""
			return true
		}
		if msg := checkListen(v); msg != "" {
			l.errf(n, field, "%s", msg)
			return false
		}
		*dst = v
		return true
	}
	if listenAt("listen", &s.Listen, false) {
		addrs["listen"] = s.Listen
	}
	s.GRPCListen, s.GRPCListenDerived = DefaultGRPCListen(s.Listen), !o.has("grpc_listen")
	if listenAt("grpc_listen", &s.GRPCListen, true) && s.GRPCListen != "" {
		addrs["grpc_listen"] = s.GRPCListen
	}
	if n, ok := o.vals["store"]; ok {
		if so := l.object(n, "store", []string{"url"}); so != nil {
			if v, n, ok := so.str("url"); ok {
				if msg := checkStoreURL(v); msg != "" {
					l.errf(n, "store.url", "%s", msg)
				} else {
					s.StoreURL = v
				}
			}
		}
	}
	if v, n, ok := o.str("admin_token_env"); ok {
		if !envName.MatchString(v) {
			l.errf(n, "admin_token_env", "must be the name of an environment variable, such as SLUICE_ADMIN_TOKEN (got %q)", v)
		} else {
			s.AdminTokenEnv = v
		}
	}
	if vals, nodes, ok := o.strList("trusted_proxies"); ok {
		for i, v := range vals {
			pr, msg := parseCIDR(v)
			if msg != "" {
				l.errf(nodes[i], "trusted_proxies", "%s", msg)
				continue
			}
			s.TrustedProxies = append(s.TrustedProxies, pr)
		}
	}
	if n, ok := o.vals["proxy"]; ok {
		if po := l.object(n, "proxy", []string{"listen", "upstream", "upstream_timeout"}); po != nil {
			up, upN, upOK := po.str("upstream")
			ls, lsN, lsOK := po.str("listen")
			if upOK {
				if msg := checkUpstream(up); msg != "" {
					l.errf(upN, "proxy.upstream", "%s", msg)
				} else {
					s.ProxyUpstream = up
				}
			}
			if lsOK {
				if msg := checkListen(ls); msg != "" {
					l.errf(lsN, "proxy.listen", "%s", msg)
				} else {
					s.ProxyListen = ls
					addrs["proxy.listen"] = ls
				}
			}
			if upOK && !po.has("listen") {
				l.errf(po.n, "proxy.listen", "is required with proxy.upstream (the address the proxy serves on, such as \":8000\")")
			}
			if lsOK && !po.has("upstream") {
				l.errf(po.n, "proxy.upstream", "is required with proxy.listen (the URL requests are forwarded to)")
			}
			if d, dn, ok := po.duration("upstream_timeout"); ok {
				switch {
				case d <= 0:
					l.errf(dn, "proxy.upstream_timeout", "must be > 0 (got %q): an upstream that never answers would hold every request sent to it", dn.Value)
				case !po.has("upstream"):
					l.errf(dn, "proxy.upstream_timeout", "applies only with proxy.upstream and proxy.listen")
				default:
					s.ProxyUpstreamTimeout = d
				}
			}
		}
	}
	if listenAt("api_listen", &s.APIListen, false) && s.APIListen != "" {
		addrs["api_listen"] = s.APIListen
	}
	if v, n, ok := o.str("api_token_env"); ok {
		s.APITokenEnv = l.apiToken(v, n)
	}
	if n, ok := o.vals["server"]; ok {
		l.serverLimits(n, &s.Server)
	}
	l.checkDistinct(o, addrs)
	if vals, nodes, ok := o.strList("headers"); ok {
		l.headers(o, vals, nodes, s)
	}
	if v, n, ok := o.integer("deny_status"); ok {
		if v < 400 || v > 599 {
			l.errf(n, "deny_status", "must be a 4xx or 5xx status, such as 429 (or 403 for nginx auth_request), got %d", v)
		} else {
			s.DenyStatus = v
		}
	}
	if v, n, ok := o.str("audit_log"); ok {
		if v == "" {
			l.errf(n, "audit_log", "must be a file path (leave the field out to write no audit log)")
		}
		s.AuditLog = v
	}
	if v, n, ok := o.integer("ipv6_prefix"); ok {
		if v < 1 || v > 128 {
			l.errf(n, "ipv6_prefix", "must be between 1 and 128 (got %d)", v)
		} else {
			s.IPv6Prefix = v
		}
	}
	if v, n, ok := o.str("missing_key"); ok {
		s.MissingKey, _ = l.missingKey(v, n, "missing_key")
	}
	if n, ok := o.vals["grpc_tls"]; ok {
		s.GRPCTLS = l.grpcTLS(n, "grpc_tls")
	}
	if v, _, ok := o.boolean("allow_negative_hits"); ok {
		s.AllowNegativeHits = v
	}

	items, rulesN, ok := o.list("rules")
	switch {
	case !o.has("rules"):
		l.errf(root, "rules", "is required: at least one rule")
	case ok && len(items) == 0:
		l.errf(rulesN, "rules", "must hold at least one rule")
	}
	for i, it := range items {
		r := l.rule(it, fmt.Sprintf("rules[%d]", i), s.MissingKey)
		if r == nil {
			continue
		}
		if prev, dup := p.byName[r.Name]; dup {
			l.errf(it, fmt.Sprintf("rules[%d].name", i), "%q is already the name of the rule at line %d", r.Name, prev.Line)
			continue
		}
		p.byName[r.Name] = r
		p.Rules = append(p.Rules, r)
	}
	l.indexLimits(p)
	if n, ok := o.vals["forward_auth"]; ok {
		l.forwardAuth(n, s)
	}
	l.forwardAuthWarnings(o, s)

	s.RulesTable = l.rulesTable(o, len(s.TrustedProxies) > 0)
	if n, ok := o.vals["jwt"]; ok {
		p.jwt = l.jwt(n, "jwt")
	} else {
		l.needJWT()
	}
	return p
}

// needJWT reports a claim read by a file without a jwt section.
func (l *loader) needJWT() {
	if l.usesJWT != nil {
		l.errf(l.usesJWT, l.jwtPath, "reads a JWT claim, but there is no jwt section: configure verification keys (hmac_secret_env, public_keys or jwks_file), or jwt: {verify: false} when a gateway in front has verified the token")
	}
}

// RulesTableOf reads the rules_table section of a configuration as Parse
// does (defaults included), checking nothing else: the PostgreSQL rules
// table needs the identities before its rows can join the file's rules.
// A nil data is a file without the section and without a jwt section.
func RulesTableOf(filename string, data []byte) (RulesTable, error) {
	l := &loader{file: filename}
	var t RulesTable
	if len(data) == 0 {
		return t, nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		l.syntaxError(err)
	} else if len(doc.Content) > 0 {
		if o := l.object(doc.Content[0], "", nil); o != nil {
			t = l.rulesTable(o, true) // warnings are Parse's to give
			if !o.has("jwt") {
				l.needJWT()
			}
		}
	}
	if len(l.errs) > 0 {
		es := &Errors{}
		for _, e := range l.errs {
			es.List = append(es.List, e)
		}
		return RulesTable{}, es
	}
	return t, nil
}

var rulesTableFields = []string{"plan", "user", "default_plan"}

// rulesTable reads the rules_table section of top. trusted says whether
// trusted_proxies are configured: without them, a plan or user read from
// the request itself is whatever the client sends, which is warned about.
func (l *loader) rulesTable(top *obj, trusted bool) RulesTable {
	var t RulesTable
	if top.has("jwt") {
		t.Plan, t.User = "jwt:plan", "jwt:sub"
	}
	n, ok := top.vals["rules_table"]
	if !ok {
		return t
	}
	o := l.object(n, "rules_table", rulesTableFields)
	if o == nil {
		return t
	}
	for _, f := range []struct {
		field string
		dst   *string
		kinds []sourceKind
		want  string
	}{
		{"plan", &t.Plan, []sourceKind{srcJWT, srcHeader, srcQuery, srcDescriptorKey}, "jwt:CLAIM, header:NAME, query:NAME or descriptor:KEY"},
		{"user", &t.User, []sourceKind{srcJWT, srcHeader, srcQuery, srcDescriptorKey, srcIP}, "jwt:CLAIM, ip:address, header:NAME, query:NAME or descriptor:KEY"},
	} {
		v, vn, ok := o.str(f.field)
		if !ok {
			continue
		}
		path := join("rules_table", f.field)
		src, msg := parseSource(v, false)
		if msg != "" || !slices.Contains(f.kinds, src.kind) {
			l.errf(vn, path, "must be %s (got %q)", f.want, v)
			continue
		}
		l.noteJWT(src, vn, path)
		*f.dst = v
		if (src.kind == srcHeader || src.kind == srcQuery) && !trusted {
			l.warnf(vn, path, "%s is whatever the client sends and no trusted_proxies are configured, so nothing in front sets or strips it: any client can pick its %s (read it from a verified claim, jwt:CLAIM, or have the proxy in front set it on every request and list that proxy in trusted_proxies)", v, f.field)
		}
	}
	if v, vn, ok := o.str("default_plan"); ok {
		if !validName(v) {
			l.errf(vn, "rules_table.default_plan", "%q must be 1 to 64 of A-Z a-z 0-9 _ . -", v)
		} else {
			t.DefaultPlan = v
		}
	}
	return t
}

// indexLimits names every limit ("RULE", "RULE.TIER") and checks that no
// two share a name: their buckets would be shared.
func (l *loader) indexLimits(p *Policy) {
	for _, r := range p.Rules {
		add := func(lim *sluice.Limit) {
			if lim == nil {
				return
			}
			if _, dup := p.limits[lim.Name()]; dup {
				l.errf(&yaml.Node{Line: r.Line}, "rules."+r.Name, "limit name %q is used twice (a rule named like another rule's tier); rename one, as their buckets would be shared", lim.Name())
				return
			}
			p.limits[lim.Name()] = lim
		}
		if r.own != nil {
			add(r.own.limit)
		}
		for _, t := range r.Tiers {
			add(t.Limit)
		}
	}
}

func (l *loader) checkDistinct(o *obj, addrs map[string]string) {
	seen := map[string]string{}
	for _, f := range []string{"listen", "grpc_listen", "proxy.listen", "api_listen"} {
		a, ok := addrs[f]
		if !ok {
			continue
		}
		if _, port, _ := net.SplitHostPort(a); port == "0" {
			continue // any free port: never the same as another
		}
		if other, dup := seen[a]; dup {
			var n *yaml.Node
			if f == "proxy.listen" {
				if pn, ok := o.vals["proxy"]; ok {
					n = pn
				}
			} else {
				n = o.vals[f]
			}
			if n == nil {
				n = o.n
			}
			hint := ""
			if f == "grpc_listen" && !o.has("grpc_listen") {
				hint = " (grpc_listen defaults to listen's host with port 8081; set grpc_listen to another address)"
			}
			l.errf(n, f, "%q is also %s's address%s", a, other, hint)
			continue
		}
		seen[a] = f
	}
}

func (l *loader) headers(o *obj, vals []string, nodes []*yaml.Node, s *Settings) {
	n := o.vals["headers"]
	if len(vals) == 0 && len(n.Content) == 0 {
		l.errf(n, "headers", "must name at least one header set (draft, trio, legacy), or none")
		return
	}
	seen := map[string]bool{}
	var out []string
	for i, v := range vals {
		switch v {
		case "draft", "trio", "legacy", "none":
		default:
			l.errf(nodes[i], fmt.Sprintf("headers[%d]", i), "unknown header set %q (want draft, trio, legacy or none)", v)
			continue
		}
		if seen[v] {
			l.errf(nodes[i], fmt.Sprintf("headers[%d]", i), "%q is listed twice", v)
			continue
		}
		seen[v] = true
		out = append(out, v)
	}
	if seen["none"] && len(vals) > 1 {
		l.errf(n, "headers", "none must stand alone")
	}
	s.Headers = out
}

// minAPIToken is the shortest api_token accepted: the token is the only
// thing between the network and every bucket, and guesses cost nothing.
const minAPIToken = 16

// apiToken checks api_token_env: the variable must hold a token now, so
// that a forgotten export stops serve (and check) instead of serving the
// decision API open or refusing every call.
func (l *loader) apiToken(name string, n *yaml.Node) string {
	switch tok := l.getenv(name); {
	case !envName.MatchString(name):
		l.errf(n, "api_token_env", "must be the name of an environment variable, such as SLUICE_API_TOKEN (got %q)", name)
	case tok == "":
		l.errf(n, "api_token_env", "environment variable %s is not set or empty", name)
	case len(tok) < minAPIToken:
		l.errf(n, "api_token_env", "the token in %s is %d bytes; use at least %d (random, such as: openssl rand -hex 32)", name, len(tok), minAPIToken)
	default:
		return name
	}
	return ""
}

var serverFields = []string{"read_header_timeout", "read_timeout", "write_timeout", "idle_timeout", "max_header_bytes", "max_conns"}

// serverLimits reads the server section into s, which holds the defaults.
// Zero would mean "no deadline" to net/http, so every timeout must be
// positive: a listener without deadlines is what slow clients exploit.
func (l *loader) serverLimits(n *yaml.Node, s *ServerLimits) {
	o := l.object(n, "server", serverFields)
	if o == nil {
		return
	}
	for _, f := range []struct {
		name string
		dst  *time.Duration
	}{
		{"read_header_timeout", &s.ReadHeaderTimeout},
		{"read_timeout", &s.ReadTimeout},
		{"write_timeout", &s.WriteTimeout},
		{"idle_timeout", &s.IdleTimeout},
	} {
		d, dn, ok := o.duration(f.name)
		switch {
		case !ok:
		case d <= 0:
			l.errf(dn, "server."+f.name, "must be > 0 (got %q): a listener without this deadline can be held by a client that never finishes", dn.Value)
		default:
			*f.dst = d
		}
	}
	if v, vn, ok := o.integer("max_header_bytes"); ok {
		if v < 4<<10 || v > 16<<20 {
			l.errf(vn, "server.max_header_bytes", "must be between 4096 and 16777216 (got %d)", v)
		} else {
			s.MaxHeaderBytes = v
		}
	}
	if v, vn, ok := o.integer("max_conns"); ok {
		if v < 1 || v > 1<<20 {
			l.errf(vn, "server.max_conns", "must be between 1 and 1048576 (got %d)", v)
		} else {
			s.MaxConns = v
		}
	}
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func checkListen(v string) string {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Sprintf("must be an address such as \":8080\" or \"127.0.0.1:8080\" (got %q)", v)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Sprintf("port %q must be a number from 0 to 65535", port)
	}
	return ""
}

func checkStoreURL(v string) string {
	u, err := url.Parse(v)
	if err != nil || u.Scheme == "" || !strings.Contains(v, "://") {
		return fmt.Sprintf("must be a URL such as \"memory://\", \"redis://host:6379\" or \"postgres://...\" (got %q)", v)
	}
	return ""
}

func checkUpstream(v string) string {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Sprintf("must be an absolute http:// or https:// URL (got %q)", v)
	}
	return ""
}

// parseCIDR reads a CIDR or a bare address (one host).
func parseCIDR(v string) (netip.Prefix, string) {
	if strings.Contains(v, "/") {
		pr, err := netip.ParsePrefix(v)
		if err != nil {
			return pr, fmt.Sprintf("must be a CIDR such as \"10.0.0.0/8\" or an address (got %q)", v)
		}
		if pr.Masked() != pr {
			return pr, fmt.Sprintf("%q has host bits set; did you mean %q?", v, pr.Masked().String())
		}
		if pr.Addr().Is4In6() {
			pr = netip.PrefixFrom(pr.Addr().Unmap(), pr.Bits()-96)
		}
		return pr, ""
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return netip.Prefix{}, fmt.Sprintf("must be a CIDR such as \"10.0.0.0/8\" or an address (got %q)", v)
	}
	a = a.Unmap().WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), ""
}

func (l *loader) missingKey(v string, n *yaml.Node, path string) (MissingKey, bool) {
	switch v {
	case "shared":
		return MissingShared, true
	case "skip":
		return MissingSkip, true
	}
	l.errf(n, path, "must be shared or skip (got %q)", v)
	return MissingShared, false
}

var ruleFields = []string{"name", "limit_keys", "match", "tiers", "algorithm", "algorithm_config", "mode", "on_store_error", "missing_key"}

func (l *loader) rule(n *yaml.Node, path string, missing MissingKey) *Rule {
	o := l.object(n, path, ruleFields)
	if o == nil {
		return nil
	}
	r := &Rule{Line: o.n.Line, MissingKey: missing}
	name, nameN, ok := o.str("name")
	switch {
	case !o.has("name"):
		l.errf(o.n, join(path, "name"), "is required")
	case ok && !validName(name):
		l.errf(nameN, join(path, "name"), "%q must be 1 to 64 of A-Z a-z 0-9 _ . -", name)
	case ok:
		r.Name = name
	}
	alg := sluice.TokenBucket
	if v, an, ok := o.str("algorithm"); ok {
		a, err := sluice.ParseAlgorithm(v)
		if err != nil {
			l.errf(an, join(path, "algorithm"), "unknown algorithm %q (want token_bucket, fixed_window, sliding_log or leaky_bucket)", v)
			return nil
		}
		alg = a
	}
	r.Algorithm = alg
	if v, mn, ok := o.str("mode"); ok {
		switch v {
		case "enforce":
			r.Mode = EnforceMode
		case "shadow":
			r.Mode = Shadow
		default:
			l.errf(mn, join(path, "mode"), "must be enforce or shadow (got %q)", v)
		}
	}
	if v, en, ok := o.str("on_store_error"); ok {
		switch v {
		case "allow":
			r.OnStoreError = AllowOnError
		case "deny":
			r.OnStoreError = DenyOnError
		default:
			l.errf(en, join(path, "on_store_error"), "must be allow or deny (got %q)", v)
		}
	}
	if v, mn, ok := o.str("missing_key"); ok {
		r.MissingKey, _ = l.missingKey(v, mn, join(path, "missing_key"))
	}
	if vals, nodes, ok := o.strList("limit_keys"); ok {
		seen := map[string]bool{}
		for i, v := range vals {
			p := fmt.Sprintf("%s.limit_keys[%d]", path, i)
			src, msg := parseSource(v, false)
			if msg != "" {
				l.errf(nodes[i], p, "%s", msg)
				continue
			}
			if seen[src.text] {
				l.errf(nodes[i], p, "%q is listed twice", v)
				continue
			}
			seen[src.text] = true
			l.noteJWT(src, nodes[i], p)
			r.keys = append(r.keys, src)
			r.LimitKeys = append(r.LimitKeys, v)
		}
	}
	if mn, ok := o.vals["match"]; ok {
		r.match = l.match(mn, join(path, "match"))
	}
	limName := r.Name
	if limName == "" {
		limName = "rule"
	}
	if cn, ok := o.vals["algorithm_config"]; ok {
		r.own = l.algConfig(cn, join(path, "algorithm_config"), alg, limName)
	}
	if tn, ok := o.vals["tiers"]; ok {
		r.Tiers = l.tiers(o, tn, join(path, "tiers"), alg, limName, r.own != nil)
	}
	switch {
	case !o.has("algorithm_config") && !o.has("tiers"):
		l.errf(o.n, join(path, "algorithm_config"), "is required (or tiers)")
	case r.own != nil:
		r.Limit = r.own.limit
	case len(r.Tiers) > 0:
		r.Limit = r.Tiers[len(r.Tiers)-1].Limit
	}
	if r.Name == "" {
		return nil
	}
	return r
}

func (l *loader) noteJWT(src source, n *yaml.Node, path string) {
	if src.kind == srcJWT && l.usesJWT == nil {
		l.usesJWT, l.jwtPath = n, path
	}
}

func (l *loader) tiers(ro *obj, n *yaml.Node, path string, alg sluice.Algorithm, rule string, hasOwn bool) []*Tier {
	if n.Kind != yaml.SequenceNode {
		l.errf(n, path, "must be a list of tiers (got %s)", kindName(n))
		return nil
	}
	if len(n.Content) == 0 {
		l.errf(n, path, "must hold at least one tier (or leave tiers out)")
		return nil
	}
	var out []*Tier
	names := map[string]bool{}
	for i, it := range n.Content {
		tp := fmt.Sprintf("%s[%d]", path, i)
		o := l.object(it, tp, []string{"name", "match", "algorithm_config"})
		if o == nil {
			continue
		}
		t := &Tier{}
		name, nn, ok := o.str("name")
		switch {
		case !o.has("name"):
			l.errf(o.n, join(tp, "name"), "is required")
		case ok && !validName(name):
			l.errf(nn, join(tp, "name"), "%q must be 1 to 64 of A-Z a-z 0-9 _ . -", name)
		case ok && names[name]:
			l.errf(nn, join(tp, "name"), "%q is already a tier of this rule", name)
		case ok:
			t.Name = name
			names[name] = true
		}
		if mn, ok := o.vals["match"]; ok {
			t.match = l.match(mn, join(tp, "match"))
		}
		last := i == len(n.Content)-1
		if len(t.match) == 0 && !last {
			l.errf(o.n, tp, "has no match, so it takes every request and the tiers after it are never used; give it a match or move it last")
		}
		if len(t.match) == 0 && last && hasOwn {
			l.errf(o.n, tp, "has no match, so it takes every request and the rule's own algorithm_config is never used; give it a match or remove one of them")
		}
		cn, ok := o.vals["algorithm_config"]
		if !ok {
			l.errf(o.n, join(tp, "algorithm_config"), "is required")
			continue
		}
		t.v = l.algConfig(cn, join(tp, "algorithm_config"), alg, rule+"."+t.Name)
		if t.v == nil || t.Name == "" {
			continue
		}
		t.Limit = t.v.limit
		out = append(out, t)
	}
	return out
}

func (l *loader) match(n *yaml.Node, path string) []cond {
	o := l.object(n, path, nil)
	if o == nil {
		return nil
	}
	var out []cond
	for i := 0; i+1 < len(o.n.Content); i += 2 {
		k := deref(o.n.Content[i])
		name := k.Value
		v, ok := o.vals[name]
		if !ok {
			continue // reported by object
		}
		p := join(path, name)
		var c cond
		if name == "path_prefix" {
			c = cond{src: source{kind: srcPath, text: name}, prefix: true}
		} else {
			src, msg := parseSource(name, true)
			if msg != "" {
				l.errf(k, p, "%s", msg)
				continue
			}
			c.src = src
			l.noteJWT(src, k, p)
		}
		values, ok := l.matchValues(v, p)
		if !ok {
			continue
		}
		for j, val := range values {
			switch {
			case c.prefix:
				if !strings.HasPrefix(val, "/") {
					l.errf(v, p, "%q must start with /", val)
					ok = false
				}
				values[j] = cleanPath(val)
			case c.src.kind == srcMethod:
				values[j] = strings.ToUpper(val)
			case c.src.kind == srcHost:
				values[j] = hostOnly(val)
			case c.src.kind == srcPath:
				values[j] = cleanPath(val)
			}
		}
		if !ok {
			continue
		}
		c.values = values
		out = append(out, c)
	}
	return out
}

// matchValues reads a condition's value: one scalar, or a list of them
// (any of which matches).
func (l *loader) matchValues(n *yaml.Node, path string) ([]string, bool) {
	scalar := func(s *yaml.Node, p string) (string, bool) {
		s = deref(s)
		if s.Kind != yaml.ScalarNode || isNull(s) {
			l.errf(s, p, "must be a value or a list of values (got %s)", kindName(s))
			return "", false
		}
		return s.Value, true
	}
	if n.Kind == yaml.SequenceNode {
		if len(n.Content) == 0 {
			l.errf(n, path, "an empty list matches nothing; give at least one value")
			return nil, false
		}
		var out []string
		ok := true
		for i, it := range n.Content {
			v, good := scalar(it, fmt.Sprintf("%s[%d]", path, i))
			ok = ok && good
			out = append(out, v)
		}
		return out, ok
	}
	v, ok := scalar(n, path)
	return []string{v}, ok
}

var (
	costFields   = []string{"cost_source", "fixed_cost", "default_cost", "min_cost"}
	tbFields     = []string{"tokens_per_second", "rps", "burst", "rate", "period", "capacity", "reserve", "max_reserved"}
	lbFields     = []string{"tokens_per_second", "rps", "rate", "period", "max_delay"}
	fwFields     = []string{"rate", "period", "capacity", "start"}
	slFields     = []string{"rate", "period", "capacity"}
	allAlgFields = []string{"tokens_per_second", "rps", "burst", "rate", "period", "capacity", "start", "reserve", "max_reserved", "max_delay", "cost_source", "fixed_cost", "default_cost", "min_cost"}
)

func algFields(a sluice.Algorithm) []string {
	switch a {
	case sluice.LeakyBucket:
		return append(lbFields, costFields...)
	case sluice.FixedWindow:
		return append(fwFields, costFields...)
	case sluice.SlidingLog:
		return append(slFields, costFields...)
	}
	return append(tbFields, costFields...)
}

// algConfig validates an algorithm_config for alg and compiles it into a
// limit called name.
func (l *loader) algConfig(n *yaml.Node, path string, alg sluice.Algorithm, name string) *variant {
	allowed := algFields(alg)
	o := l.object(n, path, allAlgFields)
	if o == nil {
		return nil
	}
	errsBefore := len(l.errs)
	for i := 0; i+1 < len(o.n.Content); i += 2 {
		k := deref(o.n.Content[i])
		if _, ok := o.vals[k.Value]; ok && !contains(allowed, k.Value) {
			l.errf(k, join(path, k.Value), "does not apply to %s (it takes %s)", alg, strings.Join(allowed, ", "))
			delete(o.vals, k.Value)
		}
	}
	spec := sluice.Spec{Name: name, Algorithm: alg}
	positive := func(field string) (float64, *yaml.Node, bool) {
		v, vn, ok := o.num(field)
		if ok && v <= 0 {
			l.errf(vn, join(path, field), "must be > 0 (got %v)", v)
			return 0, vn, false
		}
		return v, vn, ok
	}
	tps, _, tpsOK := positive("tokens_per_second")
	rps, rpsN, rpsOK := positive("rps")
	if o.has("tokens_per_second") && o.has("rps") {
		l.errf(rpsN, join(path, "rps"), "is an alias of tokens_per_second: give one of them")
	} else if rpsOK {
		tps, tpsOK = rps, true
	}
	perSecond := o.has("tokens_per_second") || o.has("rps")
	tpsName := "tokens_per_second"
	if o.has("rps") {
		tpsName = "rps"
	}
	rate, rateN, rateOK := positive("rate")
	period, periodN, periodOK := o.duration("period")
	if periodOK && period <= 0 {
		l.errf(periodN, join(path, "period"), "must be > 0 (got %q)", periodN.Value)
		periodOK = false
	}
	burst, burstN, burstOK := positive("burst")
	capacity, capN, capOK := positive("capacity")
	switch {
	case perSecond && o.has("rate"):
		l.errf(rateN, join(path, "rate"), "give either %s or rate (with period), not both", tpsName)
	case perSecond && o.has("period"):
		l.errf(periodN, join(path, "period"), "%s is per second; use rate with period for another period", tpsName)
	case perSecond && o.has("capacity"):
		l.errf(capN, join(path, "capacity"), "goes with rate and period; with %s, the bucket size is burst", tpsName)
	case o.has("rate") && o.has("burst"):
		l.errf(burstN, join(path, "burst"), "goes with tokens_per_second (rps); with rate and period, the bucket size is capacity")
	case !perSecond && !o.has("rate"):
		switch alg {
		case sluice.TokenBucket, sluice.LeakyBucket:
			l.errf(o.n, path, "needs a rate: tokens_per_second (or its alias rps), or rate with period")
		default:
			l.errf(o.n, path, "needs rate and period")
		}
	case o.has("rate") && !o.has("period") && (alg == sluice.FixedWindow || alg == sluice.SlidingLog):
		l.errf(o.n, join(path, "period"), "is required with rate for %s (such as \"1m\")", alg)
	case perSecond && alg == sluice.TokenBucket && !o.has("burst"):
		l.errf(o.n, join(path, "burst"), "is required with %s (the bucket size, >= %s)", tpsName, tpsName)
	case tpsOK && burstOK && burst < tps:
		l.errf(burstN, join(path, "burst"), "must be >= %s (%v)", tpsName, tps)
	}
	if tpsOK {
		spec.TokensPerSecond = tps
	}
	if rateOK {
		spec.Rate = rate
	}
	if periodOK {
		spec.Period = period
	}
	if burstOK {
		spec.Burst = burst
	}
	if capOK {
		spec.Capacity = capacity
	}
	v := &variant{cost: costSpec{fixed: 1, def: 1, min: 1}}
	if b, _, ok := o.boolean("reserve"); ok {
		v.reserve = b
	}
	if mr, _, ok := positive("max_reserved"); ok {
		spec.MaxReserved = mr
	}
	if d, dn, ok := o.duration("max_delay"); ok {
		if d <= 0 {
			l.errf(dn, join(path, "max_delay"), "must be > 0")
		}
		spec.MaxDelay = d
	}
	if sn, ok := o.vals["start"]; ok {
		if st, ok := l.start(sn, join(path, "start")); ok {
			spec.Start = &st
		}
	}
	costN := l.cost(o, path, &v.cost)
	if len(l.errs) > errsBefore {
		return nil
	}
	lim, err := sluice.NewLimit(spec)
	if err != nil {
		msg := err.Error()
		if i := strings.Index(msg, "\": "); i >= 0 {
			msg = msg[i+3:]
		}
		l.errf(o.n, path, "%s", msg)
		return nil
	}
	v.limit = lim
	checks := []struct {
		field string
		cost  float64
	}{{"fixed_cost", v.cost.fixed}, {"default_cost", v.cost.def}}
	if v.cost.src != nil {
		checks = append(checks, struct {
			field string
			cost  float64
		}{"min_cost", v.cost.min})
	}
	for _, c := range checks {
		if _, err := lim.Cost(c.cost); err != nil {
			at := costN[c.field]
			if at == nil {
				at = o.n
			}
			if errors.Is(err, sluice.ErrCostExceedsLimit) {
				l.errf(at, join(path, c.field), "%v is above the limit's capacity (%v): no request could ever pass", c.cost, lim.Capacity())
			} else {
				l.errf(at, join(path, c.field), "%v is not a usable cost (at least 0.000001)", c.cost)
			}
			return nil
		}
	}
	if v.cost.src != nil && v.cost.def < v.cost.min {
		// Else a client would pay less by sending no cost at all than by
		// declaring the least it may.
		field, at := "default_cost", costN["default_cost"]
		if at == nil {
			field, at = "min_cost", costN["min_cost"]
		}
		l.errf(at, join(path, field), "default_cost (%v) is below min_cost (%v): a request without a usable cost would pay less than the least a declared one pays; raise default_cost or lower min_cost", v.cost.def, v.cost.min)
		return nil
	}
	return v
}

// cost reads cost_source, fixed_cost, default_cost and min_cost into c
// and returns their nodes.
func (l *loader) cost(o *obj, path string, c *costSpec) map[string]*yaml.Node {
	nodes := map[string]*yaml.Node{}
	srcName := "fixed"
	if v, n, ok := o.str("cost_source"); ok {
		nodes["cost_source"] = n
		srcName = v
		if v != "fixed" {
			src, msg := parseSource(v, false)
			if msg != "" || (src.kind != srcHeader && src.kind != srcQuery) {
				l.errf(n, join(path, "cost_source"), "must be fixed, header:NAME or query:NAME (got %q)", v)
			} else {
				c.src = &src
			}
		}
	}
	if v, n, ok := o.num("fixed_cost"); ok {
		nodes["fixed_cost"] = n
		switch {
		case srcName != "fixed":
			l.errf(n, join(path, "fixed_cost"), "applies only with cost_source: fixed (the cost is read from %s; default_cost covers requests without it)", srcName)
		case v <= 0:
			l.errf(n, join(path, "fixed_cost"), "must be > 0 (got %v)", v)
		default:
			c.fixed = v
		}
	}
	if v, n, ok := o.num("default_cost"); ok {
		nodes["default_cost"] = n
		if v <= 0 {
			l.errf(n, join(path, "default_cost"), "must be > 0 (got %v)", v)
		} else {
			c.def = v
		}
	}
	if v, n, ok := o.num("min_cost"); ok {
		nodes["min_cost"] = n
		switch {
		case srcName == "fixed":
			l.errf(n, join(path, "min_cost"), "applies only with cost_source header:NAME or query:NAME (it bounds the costs clients declare; fixed_cost is the cost here)")
		case v <= 0:
			l.errf(n, join(path, "min_cost"), "must be > 0 (got %v)", v)
		default:
			c.min = v
		}
	}
	return nodes
}

// start reads a fixed window's start: a duration offset from the Unix
// epoch ("30m") or an RFC 3339 time.
func (l *loader) start(n *yaml.Node, path string) (time.Duration, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!timestamp") {
		l.errf(n, path, "must be a duration offset such as \"30m\" or an RFC 3339 time (got %s)", kindName(n))
		return 0, false
	}
	if d, err := time.ParseDuration(n.Value); err == nil {
		if d < 0 {
			l.errf(n, path, "must not be negative")
			return 0, false
		}
		return d, true
	}
	t, err := time.Parse(time.RFC3339, n.Value)
	if err != nil {
		l.errf(n, path, "must be a duration offset such as \"30m\" or an RFC 3339 time such as \"2024-01-01T00:00:00Z\" (got %q)", n.Value)
		return 0, false
	}
	if t.Before(time.Unix(0, 0)) {
		l.errf(n, path, "must not be before 1970")
		return 0, false
	}
	return t.Sub(time.Unix(0, 0)), true
}

var (
	forwardAuthFields  = []string{"proxy", "method_header", "uri_header", "host_header", "client_header"}
	forwardAuthHeaders = forwardAuthFields[1:]
)

// forwardAuth reads forward_auth: the front proxy, and for custom the
// header of each attribute.
func (l *loader) forwardAuth(n *yaml.Node, s *Settings) {
	o := l.object(n, "forward_auth", forwardAuthFields)
	if o == nil {
		return
	}
	name, nameN, ok := o.str("proxy")
	if !o.has("proxy") {
		l.errf(o.n, "forward_auth.proxy", "is required: the front proxy that calls /v1/auth (%s)", orList(ForwardAuthProxies))
		return
	}
	if !ok {
		return
	}
	if !contains(ForwardAuthProxies, name) {
		msg := fmt.Sprintf("unknown proxy %q", name)
		if sg := suggest(name, ForwardAuthProxies); sg != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", sg)
		} else {
			msg += " (want " + orList(ForwardAuthProxies) + ")"
		}
		l.errf(nameN, "forward_auth.proxy", "%s", msg)
		return
	}
	if name != "custom" {
		fa := forwardAuthProxies[name]
		for _, f := range forwardAuthHeaders {
			if hn, ok := o.vals[f]; ok {
				l.errf(hn, "forward_auth."+f, "applies only with proxy: custom (%s)", fa.describe())
			}
		}
		s.ForwardAuth = fa
		return
	}
	fa := ForwardAuth{Proxy: "custom"}
	dst := map[string]*string{"method_header": &fa.MethodHeader, "uri_header": &fa.URIHeader, "host_header": &fa.HostHeader, "client_header": &fa.ClientHeader}
	seen := map[string]string{}
	good := true
	for _, f := range forwardAuthHeaders {
		p := "forward_auth." + f
		v, vn, ok := o.str(f)
		switch {
		case !o.has(f):
			l.errf(o.n, p, "is required with proxy: custom (the header the proxy sets itself)")
			good = false
			continue
		case !ok:
			good = false
			continue
		}
		if msg := checkForwardHeader(f, v); msg != "" {
			l.errf(vn, p, "%s", msg)
			good = false
			continue
		}
		c := http.CanonicalHeaderKey(v)
		if other, dup := seen[c]; dup {
			l.errf(vn, p, "%q is also %s", v, other)
			good = false
			continue
		}
		seen[c] = f
		*dst[f] = c
	}
	if good {
		s.ForwardAuth = fa
	}
}

// checkForwardHeader checks a custom forward-auth header name.
func checkForwardHeader(field, v string) string {
	if v == "" || strings.Trim(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~") != "" {
		return fmt.Sprintf("must be a header name such as \"X-Original-URI\" (got %q)", v)
	}
	switch http.CanonicalHeaderKey(v) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return fmt.Sprintf("%q is a hop-by-hop header, which no proxy passes on", v)
	case "Host":
		if field != "host_header" {
			return fmt.Sprintf("%q holds the host, not the %s", v, strings.TrimSuffix(field, "_header"))
		}
	}
	return ""
}

// describe lists the headers a forward-auth proxy's attributes come from.
func (fa ForwardAuth) describe() string {
	if fa.Proxy == "envoy" {
		return "envoy: the call's own method, path after /v1/auth and Host; the client from " + fa.ClientHeader
	}
	return fmt.Sprintf("%s reads %s, %s, %s and %s", fa.Proxy, fa.MethodHeader, fa.URIHeader, fa.HostHeader, fa.ClientHeader)
}

// forwardAuthWarnings warns about a forward_auth that cannot take effect,
// and about trusted proxies whose forward-auth calls will be judged as
// the proxy's own requests.
func (l *loader) forwardAuthWarnings(o *obj, s *Settings) {
	fn, hasFA := o.vals["forward_auth"]
	tn, hasTP := o.vals["trusted_proxies"]
	switch {
	case hasFA && len(s.TrustedProxies) == 0:
		l.warnf(fn, "forward_auth", "trusted_proxies is empty, so no caller's headers are believed and /v1/auth judges every call as itself; list the front proxy's address in trusted_proxies")
	case hasTP && !hasFA && !o.has("proxy") && len(s.TrustedProxies) > 0:
		l.warnf(tn, "trusted_proxies", "forward_auth is not set, so /v1/auth believes none of a proxy's headers and counts every call it makes as the proxy's own request; name the front proxy with forward_auth: {proxy: nginx | traefik | caddy | envoy | custom}")
	}
}

// orList joins names as "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}
