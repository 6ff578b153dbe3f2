package policy

import (
	"net/url"
	"strconv"
	"strings"
)

// presence is whether a request carries a value for a source.
type presence uint8

const (
	absent presence = iota
	present
	// ambiguous: servers read the value differently (see queryParam).
	ambiguous
)

// AmbiguousMarker is the key component of a query parameter that servers
// read differently (docs/concepts.md, "Query parameters"). Like AbsentMarker, no value a
// request sends can produce it, since values are escaped and '(' is.
const AmbiguousMarker = "(ambiguous)"

// maxQueryParams is where Go's url.ParseQuery gives up on a whole query
// (and httputil.ReverseProxy forwards an empty one): more than this many
// '&'-separated parts.
const maxQueryParams = 10000

// queryParam reads parameter name from a raw query string the way the
// servers behind sluice might, and reports whether they agree:
//
//   - as browsers, nginx, PHP, Python, Node and Rack 3 do (WHATWG
//     urlencoded): parts split at '&' only, '+' is a space, a malformed
//     %-escape is kept as written;
//   - as older frameworks do: split at '&' and ';';
//   - as Go's url.ParseQuery does: a part holding ';' or a malformed escape
//     is dropped, and a query of more than 10000 parts is dropped whole;
//   - as PHP does: a name's '.' and ' ' read as '_' (phpName).
//
// When all of them see the same single value (or all see none), that is the
// parameter: present with vals[0], or absent. Otherwise, or when the
// parameter is repeated with different values (servers differ over which
// one counts), it is ambiguous and vals holds every value any of them
// could see. A client that makes its parameter ambiguous therefore neither
// drops it (an absent key could skip a rule) nor picks a bucket of its own
// while the upstream reads another value or none at all.
func queryParam(raw, name string) (vals []string, st presence) {
	if raw == "" {
		return nil, absent
	}
	goWhole := strings.Count(raw, "&") < maxQueryParams
	php := phpName(name) == name // a name PHP can read at all
	var w, l, g, p []string
	for part := range strings.SplitSeq(raw, "&") {
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		wk, wok := queryUnescape(k)
		if php && phpName(wk) == name {
			pv, _ := queryUnescape(v)
			p = append(p, pv)
		}
		if wk == name {
			wv, vok := queryUnescape(v)
			w = append(w, wv)
			if goWhole && wok && vok && !strings.Contains(part, ";") {
				g = append(g, wv)
			}
		}
		if !strings.Contains(part, ";") {
			if wk == name {
				l = append(l, w[len(w)-1])
			}
			continue
		}
		for piece := range strings.SplitSeq(part, ";") {
			pk, pv, _ := strings.Cut(piece, "=")
			if piece == "" {
				continue
			}
			if s, _ := queryUnescape(pk); s == name {
				s, _ := queryUnescape(pv)
				l = append(l, s)
			}
		}
	}
	if len(w) == 0 && len(l) == 0 && len(g) == 0 && len(p) == 0 {
		return nil, absent
	}
	if sameValue(w, l) && sameValue(w, g) && (!php || sameValue(w, p)) {
		return w[:1], present
	}
	seen := map[string]bool{}
	for _, list := range [][]string{w, l, g, p} {
		for _, v := range list {
			if !seen[v] {
				seen[v] = true
				vals = append(vals, v)
			}
		}
	}
	return vals, ambiguous
}

// sameValue reports whether a and b both hold one value, repeated any
// number of times, and it is the same.
func sameValue(a, b []string) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	for _, vs := range [2][]string{a, b} {
		for _, v := range vs {
			if v != a[0] {
				return false
			}
		}
	}
	return true
}

// phpName is the name PHP gives a query parameter named k: leading
// spaces dropped, ' ' and '.' as '_' (TestAttackQueryPHPMangledName).
func phpName(k string) string { return phpNames.Replace(strings.TrimLeft(k, " ")) }

var phpNames = strings.NewReplacer(" ", "_", ".", "_")

// queryUnescape decodes a query component as WHATWG urlencoded parsing
// does: '+' is a space, %XX a byte, and a '%' not followed by two hex
// digits stays as it is (ok is then false: Go's parser drops the part).
func queryUnescape(s string) (string, bool) {
	if !strings.ContainsAny(s, "%+") {
		return s, true
	}
	if u, err := url.QueryUnescape(s); err == nil {
		return u, true
	}
	return lenientUnescape(s, true), false
}

// lenientUnescape decodes every well-formed %XX in s (and '+' as a space
// when plus is set), keeping malformed escapes as written.
func lenientUnescape(s string, plus bool) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			n, _ := strconv.ParseUint(s[i+1:i+3], 16, 8)
			b.WriteByte(byte(n))
			i += 2
		case c == '+' && plus:
			b.WriteByte(' ')
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
