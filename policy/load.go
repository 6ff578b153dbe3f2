package policy

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/serverconf"
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
	p, _, err := parse(filename, data, os.Getenv, readKeyFile)
	return p, err
}

// ParseConfig is Parse that also returns the server's settings the file
// gives (its listeners, store and their bounds), which a Policy does not
// hold: sluice serve and sluice check read a file with it.
func ParseConfig(filename string, data []byte) (*Policy, serverconf.Settings, error) {
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
	notes    []*Error   // what a setting works out to (burst_seconds' burst)
	usesJWT  *yaml.Node // the first jwt: source, to locate "no jwt section"
	jwtPath  string
	// server is the server's settings, read beside the policy's.
	server serverconf.Settings
}

func parse(filename string, data []byte, getenv func(string) string, readFile func(string) ([]byte, error)) (*Policy, serverconf.Settings, error) {
	// The digest covers everything the policy was compiled from: the
	// file, and each variable and key file it read, in the order read.
	h := sha256.New()
	fmt.Fprintf(h, "%q %d\n", filename, len(data))
	h.Write(data)
	l := &loader{file: filename, dir: filepath.Dir(filename), getenv: func(name string) string {
		v := getenv(name)
		fmt.Fprintf(h, "env %q %q\n", name, v)
		return v
	}, readFile: func(path string) ([]byte, error) {
		b, err := readFile(path)
		fmt.Fprintf(h, "file %q %d %v\n", path, len(b), err)
		h.Write(b)
		return b, err
	}}
	p := l.load(data)
	if len(l.errs) > 0 {
		es := &Errors{}
		for _, e := range byLine(l.errs) {
			es.List = append(es.List, e)
		}
		return nil, serverconf.Settings{}, es
	}
	for _, w := range byLine(l.warns) {
		p.Warnings = append(p.Warnings, w.Error())
	}
	for _, n := range byLine(l.notes) {
		p.Notes = append(p.Notes, n.Error())
	}
	h.Sum(p.digest[:0])
	return p, l.server, nil
}

// byLine sorts es by line, those of one line in the order found.
func byLine(es []*Error) []*Error {
	slices.SortStableFunc(es, func(a, b *Error) int { return cmp.Compare(a.Line, b.Line) })
	return es
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

var topFields = []string{"listen", "grpc_listen", "store", "admin_token_env", "trusted_proxies", "client_header", "jwt", "proxy", "headers", "deny_status", "audit_log", "ipv6_prefix", "missing_key", "rules", "rules_table", "grpc_tls", "allow_negative_hits", "api_listen", "api_token_env", "server", "forward_auth", "ui", "settle_secret_env", "grpc", "xds"}

// newPolicy returns a policy holding the default of every top-level
// setting: what a file that gives only rules gets.
func newPolicy(file string) *Policy {
	p := &Policy{Source: file, byName: map[string]*Rule{}, limits: map[string]namedLimit{}}
	s := &p.Settings
	s.Headers = []string{"draft", "trio"}
	s.DenyStatus, s.IPv6Prefix = 429, 64
	s.ClientHeader = "X-Forwarded-For"
	s.UI.ShowKeys = true
	return p
}

// policy reads the top-level mapping, one section after another: the
// rules' and the policy's settings into a Policy, the server's into
// l.server. The order is the order problems on one line (a JSON file's
// only line) are reported in, and some sections read what earlier ones
// set.
func (l *loader) policy(root *yaml.Node) *Policy {
	o := l.object(root, "", topFields)
	if o == nil {
		return nil
	}
	p := newPolicy(l.file)
	s := &p.Settings
	l.server = serverconf.Default()
	srv := &l.server
	addrs := map[string]string{} // each listener's address by field, for checkDistinct
	l.listen(o, srv, addrs)
	l.store(o, srv)
	l.secretEnv(o, "admin_token_env", "token", minToken, false, &s.AdminTokenEnv)
	// The key settlement handles are signed with must be there now, so
	// that a forgotten export stops serve (and check) rather than leaving
	// each server of a fleet refusing the others' handles.
	l.secretEnv(o, "settle_secret_env", "key", MinSettleSecret, true, &s.SettleSecretEnv)
	l.trustedProxies(o, s)
	l.proxy(o, srv, addrs)
	l.apiListen(o, srv, addrs)
	l.secretEnv(o, "api_token_env", "token", minToken, true, &s.APITokenEnv)
	if n, ok := o.vals["server"]; ok {
		l.serverLimits(n, &srv.Server)
	}
	l.checkDistinct(o, addrs)
	l.headers(o, s)
	l.denyStatus(o, s)
	l.auditLog(o, s)
	o.intIn("ipv6_prefix", 1, 128, &s.IPv6Prefix)
	either(o, "missing_key", missingKeyNames, &s.MissingKey) // every rule's default
	if n, ok := o.vals["grpc_tls"]; ok {
		srv.GRPCTLS = l.grpcTLS(n, "grpc_tls")
	}
	if n, ok := o.vals["grpc"]; ok {
		l.grpcLimits(n, &srv.GRPC)
	}
	if v, _, ok := o.boolean("allow_negative_hits"); ok {
		s.AllowNegativeHits = v
	}
	l.rules(o, p)
	l.indexLimits(p)
	l.adaptiveWarnings(p)
	p.settleNeeds()
	if n, ok := o.vals["forward_auth"]; ok {
		l.forwardAuth(n, s)
	}
	l.forwardAuthWarnings(o, s)
	l.concurrencyTransports(p)
	s.RulesTable = l.rulesTable(o, len(s.TrustedProxies) > 0)
	if n, ok := o.vals["jwt"]; ok {
		p.jwt = l.jwt(n, "jwt")
	} else {
		l.needJWT()
	}
	if n, ok := o.vals["ui"]; ok {
		l.ui(n, s)
	}
	return p
}

// ui reads the live page's section.
func (l *loader) ui(n *yaml.Node, s *Settings) {
	if uo := l.object(n, "ui", []string{"show_keys"}); uo != nil {
		if v, _, ok := uo.boolean("show_keys"); ok {
			s.UI.ShowKeys = v
		}
	}
	if s.AdminTokenEnv == "" {
		l.warnf(n, "ui", "the live page (/ui, /v1/stats) needs the admin token: without admin_token_env it is disabled")
	}
}

func (l *loader) trustedProxies(o *obj, s *Settings) {
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
	if v, vn, ok := o.str("client_header"); ok {
		if msg := checkClientHeader(v); msg != "" {
			l.errf(vn, "client_header", "%s", msg)
		} else {
			s.ClientHeader = http.CanonicalHeaderKey(v)
		}
	}
}

// checkClientHeader checks client_header, the header the trusted proxies
// state the client's address in: why it is refused, or "".
func checkClientHeader(v string) string {
	if msg := checkForwardHeader("client_header", v); msg != "" {
		return msg
	}
	switch http.CanonicalHeaderKey(v) {
	case "Host", "Cookie", "Authorization", "Content-Length", "Content-Type":
		return fmt.Sprintf("%q holds no client address: name the header the proxies in front write it in (X-Forwarded-For, Forwarded, X-Real-IP)", v)
	}
	return ""
}

// trustedPrefix is pr, written v, as TrustedProxy reads it (an
// IPv4-mapped prefix as IPv4), or why it is refused: a prefix of a large
// part of the Internet (shorter than /8, and not fc00::/7) makes nearly
// every client a trusted proxy that names its own address.
func trustedPrefix(pr netip.Prefix, v string) (netip.Prefix, string) {
	if pr.Addr().Is4In6() && pr.Bits() >= 96 {
		pr = netip.PrefixFrom(pr.Addr().Unmap(), pr.Bits()-96)
	}
	if pr.IsValid() && pr.Bits() < 8 && !pr.Addr().IsPrivate() {
		return pr, fmt.Sprintf("%q trusts nearly every address as a proxy, so any client names its own address in X-Forwarded-For; list only the proxies in front", v)
	}
	return pr, ""
}

// minToken is the shortest token accepted in api_token_env and
// admin_token_env: a token is the only thing between the network and
// what it opens (every bucket; resets and the live page), and guesses
// cost nothing.
const minToken = 16

// secretEnv reads field, the name of the environment variable holding a
// secret (what: a token, a key) of least bytes or more, into *dst.
// required: the variable must hold one now (api_token_env: a forgotten
// export stops serve, and check, instead of serving the decision API open
// or refusing every call); otherwise an unset variable leaves what the
// secret opens disabled (admin_token_env).
func (l *loader) secretEnv(o *obj, field, what string, least int, required bool, dst *string) {
	name, n, ok := o.str(field)
	if !ok {
		return
	}
	switch secret := l.getenv(name); {
	case !envName.MatchString(name):
		l.errf(n, field, "must be the name of an environment variable, such as %s (got %q)", "SLUICE_"+strings.ToUpper(strings.TrimSuffix(field, "_env")), name)
	case secret == "" && required:
		l.errf(n, field, "environment variable %s is not set or empty", name)
	case secret != "" && len(secret) < least:
		l.errf(n, field, "the %s in %s is %d bytes; use at least %d (random, such as: openssl rand -hex 32)", what, name, len(secret), least)
	default:
		*dst = name
	}
}

func (l *loader) headers(o *obj, s *Settings) {
	vals, nodes, ok := o.strList("headers")
	if !ok {
		return
	}
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

func (l *loader) denyStatus(o *obj, s *Settings) {
	if v, n, ok := o.integer("deny_status"); ok {
		if v < 400 || v > 599 {
			l.errf(n, "deny_status", "must be a 4xx or 5xx status, such as 429 (or 403 for nginx auth_request), got %d", v)
		} else {
			s.DenyStatus = v
		}
	}
}

func (l *loader) auditLog(o *obj, s *Settings) {
	if v, n, ok := o.str("audit_log"); ok {
		if v == "" {
			l.errf(n, "audit_log", "must be a file path (leave the field out to write no audit log)")
		}
		s.AuditLog = v
	}
}

// noteJWT remembers the first place that reads a JWT claim, for needJWT.
func (l *loader) noteJWT(src source, n *yaml.Node, path string) {
	if src.kind == srcJWT && l.usesJWT == nil {
		l.usesJWT, l.jwtPath = n, path
	}
}

// needJWT reports a claim read by a file without a jwt section.
func (l *loader) needJWT() {
	if l.usesJWT != nil {
		l.errf(l.usesJWT, l.jwtPath, "reads a JWT claim, but there is no jwt section: configure verification keys (hmac_secret_env, public_keys or jwks_file), or jwt: {verify: false} when a gateway in front has verified the token")
	}
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

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
		return trustedPrefix(pr, v)
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return netip.Prefix{}, fmt.Sprintf("must be a CIDR such as \"10.0.0.0/8\" or an address (got %q)", v)
	}
	a = a.Unmap().WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), ""
}
