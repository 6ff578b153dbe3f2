package policy

// Settlement: a rule charges an estimate up front (cost_source, which may
// read a field of the request's JSON body) and settles with the actual
// cost once the response says it (settle_from in algorithm_config).

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
)

// CostBodyLimit is the most of a request body that a body:PATH
// cost_source reads. A longer body is not parsed: its request costs the
// rule's default_cost, as a body without the field or one that is not
// JSON does.
const CostBodyLimit = 1 << 20

// maxJSONDepth bounds the nesting of a JSON document read for a cost: a
// deeper one ("[[[[...") is not parsed, whatever its size.
const maxJSONDepth = 128

// maxPathSegments bounds a JSON path (body:usage.total_tokens is two).
const maxPathSegments = 8

// SettleKind says where a response states a request's actual cost.
type SettleKind uint8

// The places settle_from names.
const (
	// SettleHeader is a response header (header:NAME).
	SettleHeader SettleKind = iota + 1
	// SettleTrailer is a response trailer (trailer:NAME).
	SettleTrailer
	// SettleBody is a number in the response's JSON body, or in the last
	// event of a text/event-stream response that carries it
	// (body:usage.total_tokens).
	SettleBody
	// SettleCaller is the decision API's caller, through /v1/settle: the
	// proxy and the middleware read nothing (settle_from: caller).
	SettleCaller
)

// SettleFrom is a rule's settle_from: where the actual cost of a request
// the rule charged is found once it has been served.
type SettleFrom struct {
	Kind SettleKind
	// Name is the header or trailer, in canonical form.
	Name string
	// Path is the JSON path of SettleBody, split at its dots.
	Path []string
	// Text is settle_from as written.
	Text string
	// Unsettled is unsettled_cost: what a request is charged, in tokens,
	// when its response states no usable cost (see Unsettled).
	Unsettled float64
	// StreamUsage is stream_usage: include: the proxy and the middleware
	// ask an OpenAI-style stream for its usage (see IncludeStreamUsage).
	StreamUsage bool
}

// UnsettledCost is what a request charged estimate (in the limit's
// units: a Match's Request.Cost, scaled by scale) is charged when its
// response states no usable cost: unsettled_cost, scaled alike, and
// never less than the estimate. A response may fail to state it
// because the client made it so (a stream that carries no usage, an
// encoding nothing here reads, a connection dropped before the last
// event), so the charge must not be what the client asked for.
func (s *SettleFrom) UnsettledCost(estimate, scale float64) float64 {
	return max(estimate, s.Unsettled*scale)
}

// String returns settle_from as written.
func (s *SettleFrom) String() string { return s.Text }

// parseSettleFrom reads a settle_from value; the message says what is
// wrong with it, "" when nothing is.
func parseSettleFrom(v string) (*SettleFrom, string) {
	const want = "must be header:NAME, trailer:NAME, body:PATH (a JSON path such as usage.total_tokens) or caller"
	if v == "caller" {
		return &SettleFrom{Kind: SettleCaller, Text: v}, ""
	}
	kind, name, ok := strings.Cut(v, ":")
	if !ok || name == "" {
		return nil, want + " (got " + strconv.Quote(v) + ")"
	}
	s := &SettleFrom{Text: v}
	switch kind {
	case "header", "trailer":
		if !validHeaderName(name) {
			return nil, "the header name " + strconv.Quote(name) + " is not a valid HTTP field name"
		}
		s.Kind, s.Name = SettleHeader, http.CanonicalHeaderKey(name)
		if kind == "trailer" {
			s.Kind = SettleTrailer
		}
	case "body":
		path, msg := parseJSONPath(name)
		if msg != "" {
			return nil, msg
		}
		s.Kind, s.Path = SettleBody, path
	default:
		return nil, want + " (got " + strconv.Quote(v) + ")"
	}
	return s, ""
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// parseJSONPath splits a JSON path of object keys ("usage.total_tokens").
func parseJSONPath(p string) ([]string, string) {
	segs := strings.Split(p, ".")
	if len(segs) > maxPathSegments {
		return nil, "the JSON path " + strconv.Quote(p) + " has more than " + strconv.Itoa(maxPathSegments) + " keys"
	}
	for _, s := range segs {
		if s == "" || strings.TrimSpace(s) != s {
			return nil, "the JSON path " + strconv.Quote(p) + " must be object keys joined by dots, such as usage.total_tokens"
		}
	}
	return segs, ""
}

// settleFrom reads an algorithm_config's settle_from, unsettled_cost and
// stream_usage into v.
func (l *loader) settleFrom(o *obj, v *variant) {
	s, n, ok := o.str("settle_from")
	var sf *SettleFrom
	if ok {
		var msg string
		if sf, msg = parseSettleFrom(s); msg != "" {
			l.errf(n, join(o.path, "settle_from"), "%s", msg)
			sf = nil
		}
	}
	needs := func(field string) string {
		switch {
		case !ok:
			return field + " applies only with settle_from (it is what a request is charged when its response does not state the cost settle_from reads)"
		case sf != nil && sf.Kind == SettleCaller:
			return field + " does not apply with settle_from: caller (the decision API's caller states every cost)"
		}
		return ""
	}
	if c, n, has := o.num("unsettled_cost"); has {
		switch msg := needs("unsettled_cost"); {
		case msg != "":
			l.errf(n, join(o.path, "unsettled_cost"), "%s", msg)
		case !(c > 0) || c > maxUnsettled:
			l.errf(n, join(o.path, "unsettled_cost"), "must be > 0 and at most %v (got %v)", maxUnsettled, c)
		case sf != nil:
			sf.Unsettled = c
		}
	}
	if u, n, has := o.str("stream_usage"); has {
		switch msg := needs("stream_usage"); {
		case msg != "":
			l.errf(n, join(o.path, "stream_usage"), "%s", msg)
		case u != "include" && u != "off":
			l.errf(n, join(o.path, "stream_usage"), "must be include (add stream_options.include_usage to requests whose JSON body sets \"stream\": true) or off (got %q)", u)
		case sf != nil && sf.Kind != SettleBody:
			l.errf(n, join(o.path, "stream_usage"), "applies only with settle_from: body:PATH (the usage an OpenAI-style stream sends is in its last event)")
		case sf != nil:
			sf.StreamUsage = u == "include"
		}
	}
	v.settle = sf
}

// maxUnsettled bounds unsettled_cost at two billion tokens: the most a
// settlement's debt can reach on any limit (sluice.Limit.SettleDebt).
const maxUnsettled = 2e9

// settleDefault gives v's settle_from, once v's limit is built, its
// default unsettled_cost: the most one request of the limit may cost (its
// capacity; what two shards hold; the debt bound of a bucket that holds
// nothing), so that a response that states nothing costs as much as any.
func settleDefault(v *variant) {
	if v.settle == nil || v.settle.Unsettled > 0 {
		return
	}
	most := v.limit.MaxCost()
	if most <= 0 {
		most = engine.FromMicroTokens(v.limit.Params().MaxReserved)
	}
	v.settle.Unsettled = min(most, maxUnsettled)
}

// MinSettleSecret is the shortest settle_secret_env key accepted: whoever
// knows it can mint handles that refund any key.
const MinSettleSecret = 32

// SettleFrom returns where the actual cost of a request charged to lim,
// r's own limit or one of its tiers', is found: nil when lim does not
// settle. r may be nil.
func (r *Rule) SettleFrom(lim *sluice.Limit) *SettleFrom {
	if r == nil {
		return nil
	}
	if r.own != nil && r.own.limit == lim {
		return r.own.settle
	}
	for _, t := range r.Tiers {
		if t.v != nil && t.v.limit == lim {
			return t.v.settle
		}
	}
	return nil
}

// ReadsBody reports whether a rule's cost_source reads the request body
// (body:PATH), or its stream_usage rewrites it: a caller of Match then
// sets Input.Body.
func (p *Policy) ReadsBody() bool {
	reads := func(v *variant) bool {
		return v != nil && ((v.cost.src != nil && v.cost.src.kind == srcBody) || (v.settle != nil && v.settle.StreamUsage))
	}
	for _, r := range p.Rules {
		if reads(r.own) {
			return true
		}
		for _, t := range r.Tiers {
			if reads(t.v) {
				return true
			}
		}
	}
	return false
}

// SettleHeaders lists the headers and trailers that the rules' settle_from
// read from responses, canonical, each once. A client must not be the one
// to set them: the proxy and the middleware drop them from requests, so
// that an upstream that echoes request headers cannot be made to state a
// client's own cost.
func (p *Policy) SettleHeaders() []string {
	var out []string
	add := func(v *variant) {
		if v == nil || v.settle == nil || (v.settle.Kind != SettleHeader && v.settle.Kind != SettleTrailer) {
			return
		}
		for _, h := range out {
			if h == v.settle.Name {
				return
			}
		}
		out = append(out, v.settle.Name)
	}
	for _, r := range p.Rules {
		add(r.own)
		for _, t := range r.Tiers {
			add(t.v)
		}
	}
	return out
}

// ParseActual reads an actual cost as a response states it: a finite
// number >= 0, surrounded by white space or not.
func ParseActual(s string) (float64, bool) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	return f, true
}

// FromHeader reads the actual cost from a header (or trailer) map. A field
// given more than once counts its largest usable value: the one that
// charges the most, never the one that charges least.
func (s *SettleFrom) FromHeader(h http.Header) (float64, bool) {
	best, found := 0.0, false
	for _, v := range h.Values(s.Name) {
		if f, ok := ParseActual(v); ok && (!found || f > best) {
			best, found = f, true
		}
	}
	return best, found
}

// FromJSON reads the actual cost at s's path in one JSON document. A key
// given more than once counts its largest usable value. ok is false when
// data is not one well-formed JSON value or holds no number >= 0 there.
func (s *SettleFrom) FromJSON(data []byte) (float64, bool) {
	vals, ok := jsonValues(data, s.Path)
	if !ok {
		return 0, false
	}
	best, found := 0.0, false
	for _, v := range vals {
		if f, ok := ParseActual(v); ok && (!found || f > best) {
			best, found = f, true
		}
	}
	return best, found
}

// jsonValues returns the text of every number at path in the JSON document
// data ("" for a value there that is no number), each one of a key given
// more than once at any level; ok is false when data is not exactly one
// well-formed JSON value, or nests deeper than maxJSONDepth. It reads data
// token by token, keeping no tree: the memory it takes is its depth.
func jsonValues(data []byte, path []string) (vals []string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	// Each open container: whether it is an object, how many segments of
	// path lead to it (-1: off the path), whether a key comes next, and
	// the depth of the value after the current key.
	type frame struct {
		object bool
		depth  int
		key    bool
		next   int
	}
	var stack []frame
	done := false // the top-level value is complete
	depth := func() int {
		if len(stack) == 0 {
			return 0
		}
		if f := &stack[len(stack)-1]; f.object {
			return f.next
		}
		return -1 // array elements are on no path
	}
	valueDone := func() {
		if n := len(stack); n == 0 {
			done = true
		} else if stack[n-1].object {
			stack[n-1].key = true
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return vals, done
		}
		if err != nil || done {
			return nil, false
		}
		if d, isDelim := tok.(json.Delim); isDelim {
			switch d {
			case '{', '[':
				if len(stack) >= maxJSONDepth {
					return nil, false
				}
				stack = append(stack, frame{object: d == '{', depth: depth(), key: true})
			default:
				stack = stack[:len(stack)-1]
				valueDone()
			}
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].key {
			f := &stack[n-1]
			k, _ := tok.(string)
			f.key, f.next = false, -1
			if f.depth >= 0 && f.depth < len(path) && k == path[f.depth] {
				f.next = f.depth + 1
			}
			continue
		}
		if depth() == len(path) {
			num, _ := tok.(json.Number)
			vals = append(vals, num.String())
		}
		valueDone()
	}
}

// bodyCost reads a body:PATH cost: the values at the path of the request
// body's JSON, as Input.Body holds it. ok is false when there is no body
// or it is not JSON, and vals empty when the path is absent.
func (e *eval) bodyCost(src source) (vals []string, ok bool) {
	if len(e.r.Body) == 0 {
		return nil, false
	}
	path, _ := parseJSONPath(src.name)
	return jsonValues(e.r.Body, path)
}
