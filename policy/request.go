package policy

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/sluicehq/sluice/jwtauth"
)

// Input describes one request to limit: the parts of an HTTP request (or
// of an Envoy rate limit descriptor) that limit_keys, match and
// cost_source read. FromHTTP fills it from an *http.Request;
// FromForwardAuth from the headers a trusted front proxy sets; Envoy sets
// Domain and Descriptor.
type Input struct {
	// Method is the HTTP method ("GET"), compared upper-cased.
	Method string
	// Host is the requested host, with or without a port; it is compared
	// and keyed lower-cased and without the port.
	Host string
	// Path is the URL path, decoded, without the query. Rules see it
	// cleaned and lower-cased (see cleanPath and lenientPath), so
	// "/x/../Admin" is "/admin".
	Path string
	// Header holds the request headers (canonical keys, as net/http keeps
	// them).
	Header http.Header
	// RawQuery is the query as the request sent it (without '?'). When it
	// is set, query:NAME sources read it (see queryParam) and Query is
	// ignored.
	RawQuery string
	// Query holds the query parameters, for callers that build an Input
	// without a raw query; the first value of a parameter counts.
	Query url.Values
	// Peer is the socket peer.
	Peer netip.AddrPort
	// ClientIP is the resolved client address (FromHTTP and ResolveClient
	// set it). Match resolves it itself when it is not set.
	ClientIP netip.Addr

	// Domain is the Envoy rate limit domain.
	Domain string
	// Descriptor is one Envoy rate limit descriptor, in order.
	Descriptor []DescriptorEntry

	// Body is the request body, for a body:PATH cost_source (see
	// Policy.ReadsBody): at most CostBodyLimit bytes, and nil when it was
	// not read or was longer.
	Body []byte

	// peerIdentity is the identity of Peer's IPv4 address ("ip:ADDR"),
	// made once for the connection (WithPeer); "" when it was not.
	peerIdentity string
}

// DescriptorEntry is one entry of an Envoy rate limit descriptor.
type DescriptorEntry struct{ Key, Value string }

// FromHTTP describes r as the rules see it, with the client address
// resolved (see ResolveClient). It does not read the body.
func (p *Policy) FromHTTP(r *http.Request) *Input {
	in := &Input{}
	p.fromHTTP(in, r)
	return in
}

// fromHTTP is FromHTTP describing r in in.
func (p *Policy) fromHTTP(in *Input, r *http.Request) {
	*in = Input{Method: r.Method, Host: r.Host, Header: r.Header}
	in.Peer, in.peerIdentity = peerOf(r)
	if r.URL != nil {
		in.Path, in.RawQuery = r.URL.Path, r.URL.RawQuery
	}
	p.ResolveClient(in)
}

// peerOf parses r's socket peer; invalid when there is none. A server
// that parsed its connection's peer already (WithPeer) is taken at its
// word while r.RemoteAddr is still what it parsed.
func peerOf(r *http.Request) (_ netip.AddrPort, identity string) {
	if p, ok := r.Context().Value(peerKey{}).(*connPeer); ok && p.remote == r.RemoteAddr {
		return p.addr, p.identity
	}
	return parsePeer(r.RemoteAddr), ""
}

// peerHost is a socket peer's address as a client address: IPv4 in
// IPv6 unmapped, without a zone.
func peerHost(ap netip.AddrPort) netip.Addr { return ap.Addr().Unmap().WithZone("") }

// PeerAddr parses a RemoteAddr ("ip:port", "ip", "[ipv6]") as a client
// address; invalid when it is none.
func PeerAddr(remote string) netip.Addr { return peerHost(parsePeer(remote)) }

func parsePeer(remote string) netip.AddrPort {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap
	} else if a := parseHostAddr(remote); a.IsValid() {
		return netip.AddrPortFrom(a, 0)
	}
	return netip.AddrPort{}
}

// WithPeer returns ctx carrying c's peer address, parsed once: a server
// that sets it on each connection's context (http.Server.ConnContext)
// spares every request on the connection parsing RemoteAddr again.
func WithPeer(ctx context.Context, c net.Conn) context.Context {
	remote := c.RemoteAddr().String() // what net/http puts in RemoteAddr
	p := &connPeer{remote: remote, addr: parsePeer(remote)}
	if h := peerHost(p.addr); h.Is4() { // an IPv6 peer's identity is its prefix's, by the policy in force
		p.identity = ipIdentity(h, 0)
	}
	return context.WithValue(ctx, peerKey{}, p)
}

type peerKey struct{}

// connPeer is a connection's peer: RemoteAddr, its parse, and the
// identity of a client at that address.
type connPeer struct {
	remote   string
	addr     netip.AddrPort
	identity string
}

// ConnClient names the client a connection from a is counted as against
// server.max_conns_per_client: its address as ip:address keys it, or ""
// for a trusted proxy (whose connections carry every client's requests)
// and a peer without an address.
func (p *Policy) ConnClient(a net.Addr) string {
	peer := PeerAddr(a.String())
	if !peer.IsValid() || p.TrustedProxy(peer) {
		return ""
	}
	return AddressKey(peer, p.Settings.IPv6Prefix)
}

// ResolveClient sets in.ClientIP: the socket peer, unless the peer is a
// trusted proxy; then the addresses in client_header (Settings.ClientHeader)
// are walked from the right, skipping trusted hops, and the first
// untrusted hop is the client. An unparsable hop stops the walk at the last
// trusted address, so garbage never mints a fresh identity. ClientIP stays
// invalid when there is no peer (Envoy, a Unix socket).
func (p *Policy) ResolveClient(in *Input) {
	in.ClientIP = p.clientIP(in)
}

func (p *Policy) clientIP(in *Input) netip.Addr {
	if !in.Peer.IsValid() {
		return netip.Addr{}
	}
	peer := peerHost(in.Peer)
	if !p.TrustedProxy(peer) {
		return peer
	}
	return p.walkHops(peer, clientHops(in.Header, p.Settings.ClientHeader))
}

// walkHops finds the client in a list of forwarding hops (oldest first)
// reported by the trusted peer: walking from the right, the first hop
// outside trusted_proxies; an unparsable hop stops the walk at the last
// trusted address.
func (p *Policy) walkHops(peer netip.Addr, hops []string) netip.Addr {
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a := parseHostAddr(hops[i])
		if !a.IsValid() {
			return client
		}
		client = a
		if !p.TrustedProxy(a) {
			return a
		}
	}
	return client
}

// clientHops lists the addresses in h's header name, oldest first: the
// for= parameters of Forwarded (RFC 7239), or the comma-separated items
// of any other header (X-Forwarded-For, X-Real-IP). Only the one header
// the trusted proxies write is read: a proxy that appends to Forwarded
// passes a client's X-Forwarded-For on untouched, and one that appends to
// X-Forwarded-For a client's Forwarded, so reading the other as well lets
// the client name any address.
func clientHops(h http.Header, name string) []string {
	var hops []string
	forwarded := name == "Forwarded"
	for _, line := range h.Values(name) {
		for elem := range strings.SplitSeq(line, ",") {
			if !forwarded {
				if elem = strings.TrimSpace(elem); elem != "" {
					hops = append(hops, elem)
				}
				continue
			}
			for pair := range strings.SplitSeq(elem, ";") {
				k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
					hops = append(hops, strings.Trim(strings.TrimSpace(v), `"`))
				}
			}
		}
	}
	return hops
}

// parseHostAddr reads "ip", "ip:port", "[ipv6]" or "[ipv6]:port",
// unmapping IPv4-in-IPv6 and dropping zones.
func parseHostAddr(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > 64 {
		return netip.Addr{}
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap().WithZone("")
}

// sourceKind is where a value comes from.
type sourceKind uint8

const (
	srcIP sourceKind = iota
	srcHeader
	srcQuery
	srcJWT
	srcPath
	srcMethod
	srcHost
	srcDescriptorKey
	srcDescriptor
	srcDomain // match only
	srcBody   // cost_source only: a JSON path into the request body
)

// source is a parsed "kind:name" value source.
type source struct {
	kind sourceKind
	name string // header name (canonical), query name, claim, descriptor key
	text string // as written
}

// parseSource reads a limit_keys entry (or a match key when match is set,
// which also allows domain).
func parseSource(s string, match bool) (source, string) {
	kind, name, hasName := strings.Cut(s, ":")
	src := source{text: s, name: name}
	switch kind {
	case "ip":
		if name != "address" {
			return src, "ip takes only ip:address"
		}
		src.kind = srcIP
		return src, ""
	case "header", "query", "jwt":
		if !hasName || name == "" {
			return src, kind + " needs a name: " + kind + ":NAME"
		}
		if strings.TrimSpace(name) != name || strings.ContainsAny(name, " \t\r\n") {
			return src, "the name must not contain white space"
		}
		switch kind {
		case "header":
			src.kind, src.name = srcHeader, http.CanonicalHeaderKey(name)
		case "query":
			src.kind = srcQuery
		case "jwt":
			src.kind = srcJWT
		}
		return src, ""
	case "descriptor":
		if !hasName {
			src.kind = srcDescriptor
			return src, ""
		}
		if name == "" {
			return src, "descriptor needs a key (descriptor:KEY), or none for the whole descriptor"
		}
		src.kind = srcDescriptorKey
		return src, ""
	case "path", "method", "host", "domain":
		if hasName {
			return src, kind + " takes no name"
		}
		if kind == "domain" && !match {
			return src, "domain can be matched but not used as a key"
		}
		src.kind = map[string]sourceKind{"path": srcPath, "method": srcMethod, "host": srcHost, "domain": srcDomain}[kind]
		return src, ""
	}
	want := "ip:address, header:NAME, query:NAME, jwt:CLAIM, path, method, host, descriptor:KEY or descriptor"
	if match {
		want += ", domain or path_prefix"
	}
	return src, "unknown source " + strconv.Quote(s) + " (want " + want + ")"
}

// eval evaluates one request against one policy, caching what is costly
// to compute (the client address, the verified claims).
type eval struct {
	p        *Policy
	r        *Input
	ip       netip.Addr
	ipDone   bool
	claims   map[string]any
	jwtDone  bool
	pathDone bool
	path     string // cleanPath
	lenient  string // lenientPath, when it differs
	queries  map[string]queryResult
}

// queryResult is one query parameter as queryParam read it.
type queryResult struct {
	vals []string
	st   presence
}

func (e *eval) clientIP() netip.Addr {
	if !e.ipDone {
		e.ip, e.ipDone = e.r.ClientIP, true
		if !e.ip.IsValid() {
			e.ip = e.p.clientIP(e.r)
		}
		e.ip = e.ip.Unmap().WithZone("")
	}
	return e.ip
}

func (e *eval) verifiedClaims() map[string]any {
	if !e.jwtDone {
		e.jwtDone = true
		if e.p.jwt != nil {
			e.claims = e.p.jwt.Claims(e.r.Header)
		}
	}
	return e.claims
}

// paths returns the request's path as rules see it (cleanPath) and, when
// it differs, as the most lenient servers read it (lenientPath).
func (e *eval) paths() (clean, lenient string) {
	if !e.pathDone {
		e.pathDone = true
		e.path = cleanPath(e.r.Path)
		if l, ok := lenientPath(e.r.Path); ok && l != e.path {
			e.lenient = l
		}
	}
	return e.path, e.lenient
}

// keyPath is the path that goes into keys: the lenient reading when there
// is one, so that the spellings one server takes for the same resource
// share a bucket.
func (e *eval) keyPath() string {
	c, l := e.paths()
	return cmp.Or(l, c)
}

// cleanPath roots a decoded path, resolves dot segments and repeated
// slashes (path.Clean, keeping a trailing slash) and folds its case. Rules
// compare paths without case because upstreams differ (IIS, macOS file
// systems and many routers take /LOGIN for /login): a case-sensitive
// /login rule would let /LOGIN through to them. Each letter is upper-cased
// before it is lower-cased, as Java's equalsIgnoreCase compares them:
// "/ſignin" and "/sıgnin" are /signin (TestAttackPathUnicodeCaseFold).
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	c := path.Clean("/" + p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return strings.Map(func(r rune) rune { return unicode.ToLower(unicode.ToUpper(r)) }, c)
}

// lenientPath reads a decoded path as the most lenient upstreams do:
// percent escapes decoded once more (servers that decode twice), '\' as
// '/' (IIS), ";parameters" dropped from each segment (Tomcat, Jetty,
// Spring: /login;x=1 is /login) and no trailing slash (Express, Rails:
// /login/ is /login), then cleanPath. ok is false when none of that
// applies.
func lenientPath(p string) (string, bool) {
	if !strings.ContainsAny(p, "%\\;") && (len(p) < 2 || !strings.HasSuffix(p, "/")) {
		return "", false
	}
	q := lenientUnescape(p, false)
	q = strings.ReplaceAll(q, "\\", "/")
	if strings.Contains(q, ";") {
		segs := strings.Split(q, "/")
		for i, s := range segs {
			segs[i], _, _ = strings.Cut(s, ";")
		}
		q = strings.Join(segs, "/")
	}
	q = cleanPath(q)
	if len(q) > 1 {
		q = strings.TrimSuffix(q, "/")
	}
	return q, true
}

// query reads a query parameter (see queryParam), once per request.
func (e *eval) query(name string) ([]string, presence) {
	if qr, ok := e.queries[name]; ok {
		return qr.vals, qr.st
	}
	var qr queryResult
	if e.r.RawQuery != "" {
		qr.vals, qr.st = queryParam(e.r.RawQuery, name)
	} else if vs := e.r.Query[name]; len(vs) > 0 {
		qr.vals, qr.st = vs[:1], present
	}
	if e.queries == nil {
		e.queries = map[string]queryResult{}
	}
	e.queries[name] = qr
	return qr.vals, qr.st
}

// multi reports whether a match on src compares several values (values)
// rather than one (value): an array claim, an ambiguous query parameter,
// the clean and lenient paths.
func (src source) multi() bool {
	return src.kind == srcJWT || src.kind == srcQuery || src.kind == srcPath
}

// values returns the values of src in r for matching; nil when absent.
func (e *eval) values(src source) []string {
	switch src.kind {
	case srcJWT:
		v, ok := claim(e.verifiedClaims(), src.name)
		if !ok {
			return nil
		}
		return claimStrings(v)
	case srcQuery:
		// An ambiguous parameter matches every value a server could read.
		vs, st := e.query(src.name)
		if st == absent {
			return nil
		}
		return vs
	case srcPath:
		c, l := e.paths()
		if l != "" {
			return []string{c, l}
		}
		return []string{c}
	}
	v, ok := e.value(src)
	if !ok {
		return nil
	}
	return []string{v}
}

// value returns the single value of src in r as it goes into a key
// (before escaping), and whether it is present.
func (e *eval) value(src source) (string, bool) {
	r := e.r
	switch src.kind {
	case srcIP:
		a := e.clientIP()
		return AddressKey(a, e.p.Settings.IPv6Prefix), a.IsValid()
	case srcHeader:
		vs := r.Header[src.name]
		if len(vs) == 0 {
			return "", false
		}
		return vs[0], true
	case srcQuery:
		vs, st := e.query(src.name)
		if st != present {
			return "", false // key and cost handle ambiguous ones themselves
		}
		return vs[0], true
	case srcJWT:
		v, ok := claim(e.verifiedClaims(), src.name)
		if !ok {
			return "", false
		}
		if s, ok := scalarString(v); ok {
			return s, true
		}
		b, err := json.Marshal(v)
		return string(b), err == nil
	case srcPath:
		return e.keyPath(), true
	case srcMethod:
		return method(r.Method), r.Method != ""
	case srcHost:
		h := hostOnly(r.Host)
		return h, h != ""
	case srcDescriptorKey:
		for _, en := range r.Descriptor {
			if en.Key == src.name {
				return en.Value, true
			}
		}
		return "", false
	case srcDescriptor:
		if len(r.Descriptor) == 0 {
			return "", false
		}
		var b strings.Builder
		for i, en := range r.Descriptor {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(escape(en.Key, ",="))
			b.WriteByte('=')
			b.WriteString(escape(DescriptorValue(en.Key, en.Value, e.p.Settings.IPv6Prefix), ",="))
		}
		return b.String(), true
	case srcDomain:
		return r.Domain, r.Domain != ""
	}
	return "", false
}

// method is a method as rules read it: upper-cased, and HEAD as GET, since
// servers answer HEAD with GET's handler, its work and all.
func method(m string) string {
	if m = strings.ToUpper(m); m == "HEAD" {
		return "GET"
	}
	return m
}

// hostOnly lower-cases a Host header and drops its port and a trailing
// dot (TestAttackHostTrailingDotWithPort).
func hostOnly(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = strings.Trim(host, "[]")
	}
	return strings.TrimSuffix(h, ".")
}

// ambiguous returns every value of src when servers could read it
// differently: a query parameter so (queryParam), or a header given twice
// with different values (TestAttackRepeatedHeaderPicksBucket).
func (e *eval) ambiguous(src source) ([]string, bool) {
	switch src.kind {
	case srcQuery:
		vs, st := e.query(src.name)
		return vs, st == ambiguous
	case srcHeader:
		vs := e.r.Header[src.name]
		return vs, slices.ContainsFunc(vs, func(v string) bool { return v != vs[0] })
	case srcJWT:
		return nil, e.bearerAmbiguous()
	}
	return nil, false
}

// bearerAmbiguous reports whether upstreams may read another bearer token
// than the claims' (jwtauth.AmbiguousBearer), or one where sluice reads
// none: an access_token query parameter without a bearer header (RFC 6750
// section 2.3), which passport-http-bearer reads by default.
func (e *eval) bearerAmbiguous() bool {
	if jwtauth.AmbiguousBearer(e.r.Header) {
		return true
	}
	if jwtauth.BearerToken(e.r.Header) != "" {
		return false
	}
	_, st := e.query("access_token")
	return st != absent
}

// claim looks a claim up by name, then as a dotted path into nested
// objects ("org.id").
func claim(claims map[string]any, name string) (any, bool) {
	if claims == nil {
		return nil, false
	}
	if v, ok := claims[name]; ok {
		return v, v != nil
	}
	var cur any = claims
	for _, part := range strings.Split(name, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, cur != nil
}

func scalarString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	case bool:
		return strconv.FormatBool(x), true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	}
	return "", false
}

// claimStrings returns the values a match compares against: the claim
// itself when scalar, each scalar element of an array claim ("roles").
func claimStrings(v any) []string {
	if s, ok := scalarString(v); ok {
		return []string{s}
	}
	arr, _ := v.([]any)
	var out []string
	for _, x := range arr {
		if s, ok := scalarString(x); ok {
			out = append(out, s)
		}
	}
	return out
}

// maxComponent bounds one key component; longer ones are hashed.
const maxComponent = 128

// component encodes one key value: escaped, or hashed when long.
func component(src source, v string) string {
	if src.kind == srcIP {
		return v // a canonical address or prefix: no separator can occur
	}
	e := v
	if src.kind != srcDescriptor { // that one is escaped entry by entry
		e = escape(v, "")
	}
	if len(e) > maxComponent {
		sum := sha256.Sum256([]byte(v))
		return "#" + hex.EncodeToString(sum[:])
	}
	return e
}

// escape percent-encodes every byte that is not printable ASCII, and the
// bytes that structure keys: '%' (the escape), '|' (between components),
// ':' (between a key's parts), '{' and '}' (Redis Cluster hash tags), '('
// and ')' (the absent marker), '#' (a hashed component) and any of extra.
// Escaped values never contain those bytes, so no value can forge another
// component, another key or the marker of an absent or hashed one.
func escape(s, extra string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if mustEscape(s[i], extra) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hexd = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if mustEscape(c, extra) {
			b = append(b, '%', hexd[c>>4], hexd[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

// mustEscape reports whether escape escapes c. It stays small enough to
// be inlined (the search of extra is a call of its own): it runs for
// every byte of every key.
func mustEscape(c byte, extra string) bool { return escaped[c] || extra != "" && inExtra(c, extra) }

//go:noinline
func inExtra(c byte, extra string) bool { return strings.IndexByte(extra, c) >= 0 }

// escaped marks the bytes that every key component escapes: controls,
// space, non-ASCII and the separators above. A table, since every byte of
// every key is looked up in it.
var escaped = func() (t [256]bool) {
	for c := range t {
		t[c] = c <= 0x20 || c >= 0x7f || strings.IndexByte("%|:{}()#", byte(c)) >= 0
	}
	return t
}()

// globalKey is the composite key of a rule without limit_keys.
const globalKey = "*"

// key builds the composite key of rule for r. ok is false when the rule
// does not apply because a source is absent and the rule skips such
// requests.
func (e *eval) key(rule *Rule) (string, bool) {
	if len(rule.keys) == 0 {
		return globalKey, true
	}
	if len(rule.keys) == 1 {
		// The component itself: no copy to make.
		k, ok := e.keyPart(rule, rule.keys[0])
		if ok && k == "" {
			// A value sent empty: sluice.Limiter takes no empty key.
			return EmptyMarker, true
		}
		return k, ok
	}
	var b strings.Builder
	for i, src := range rule.keys {
		if i > 0 {
			b.WriteByte('|')
		}
		part, ok := e.keyPart(rule, src)
		if !ok {
			return "", false
		}
		b.WriteString(part)
	}
	return b.String(), true
}

// keyPart is the component of rule's key that src gives. ok is false when
// src is absent and the rule skips such requests.
func (e *eval) keyPart(rule *Rule, src source) (string, bool) {
	if _, amb := e.ambiguous(src); amb {
		return AmbiguousMarker, true
	}
	v, ok := e.value(src)
	if !ok {
		if rule.MissingKey == MissingSkip {
			return "", false
		}
		return AbsentMarker, true
	}
	if src.kind == srcDescriptorKey {
		v = DescriptorValue(src.name, v, e.p.Settings.IPv6Prefix)
	}
	return component(src, v), true
}

// AddressKey is client address a as keys hold it: an IPv6 one by its
// prefix of bits (ipv6_prefix), since one host commonly holds a whole /64
// and would otherwise mint buckets at will.
func AddressKey(a netip.Addr, bits int) string {
	var buf [64]byte
	return string(appendAddressKey(buf[:0], a, bits))
}

// appendAddressKey appends AddressKey(a, bits) to b.
func appendAddressKey(b []byte, a netip.Addr, bits int) []byte {
	if a = a.Unmap().WithZone(""); a.Is6() {
		return netip.PrefixFrom(a, bits).Masked().AppendTo(b)
	}
	return a.AppendTo(b)
}

// DescriptorValue is the value v of a descriptor's entry k as keys hold
// it: remote_address, the client's address that Envoy's action of that
// name sends, as AddressKey holds it (TestAttackIPv6RemoteAddressMintsBuckets).
func DescriptorValue(k, v string, bits int) string {
	if k != "remote_address" {
		return v
	}
	if a, err := netip.ParseAddr(v); err == nil && !a.Is4() { // an IPv4 one is its own key, as sent
		return AddressKey(a, bits)
	}
	return v
}

// KeyComponent returns the value v (of a header, query parameter or JWT
// claim) as it appears as one component of a bucket key: escaped, or
// hashed when long. Tools that look up a client's buckets by the value
// the client sent go through it, so they find exactly what Match keyed.
func KeyComponent(v string) string { return component(source{kind: srcHeader}, v) }
