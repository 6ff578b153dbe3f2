// Package settle is the home of settlement's reading of actual costs from
// responses: a rule charges an estimate before a request goes on, and
// once the response has been written, the actual cost it states
// (settle_from: a header, a trailer, or a number in its JSON body, gzip
// or not, or in the last event of its event stream that carries one)
// settles the charge (sluice.Limiter.Settle). A response that states no
// cost that can be used (none, one in an encoding not read here, a stream
// cut short, an error) is charged the rule's unsettled_cost instead: what
// the client can make a response leave out must not be what decides its
// charge.
//
// Source is where a rule's settle_from says the cost is (package policy
// parses the file into it), Serve and Recorder read it from a response as
// it passes, Values is the one JSON path reader (policy's body:PATH
// cost_source reads the request body with it), and Issue and Open are the
// signed handles with which the decision API's caller settles a take
// itself (settle_from: caller).
package settle

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf16"
)

// maxJSONDepth bounds the nesting of a JSON document read for a cost: a
// deeper one ("[[[[...") is not parsed, whatever its size.
const maxJSONDepth = 128

// maxPathSegments bounds a JSON path (body:usage.total_tokens is two).
const maxPathSegments = 8

// Kind says where a response states a request's actual cost.
type Kind uint8

// The places settle_from names.
const (
	// Header is a response header (header:NAME).
	Header Kind = iota + 1
	// Trailer is a response trailer (trailer:NAME).
	Trailer
	// Body is a number in the response's JSON body, or in the last event
	// of a text/event-stream response that carries it
	// (body:usage.total_tokens).
	Body
	// Caller is the decision API's caller, through /v1/settle: the proxy
	// and the middleware read nothing (settle_from: caller).
	Caller
)

// Source is a rule's settle_from: where the actual cost of a request the
// rule charged is found once it has been served.
type Source struct {
	Kind Kind
	// Name is the header or trailer, in canonical form.
	Name string
	// Path is the JSON path of Body, split at its dots.
	Path []string
	// Text is settle_from as written.
	Text string
	// Unsettled is unsettled_cost: what a request is charged, in tokens,
	// when its response states no usable cost (see UnsettledCost).
	Unsettled float64
	// StreamUsage is stream_usage: include: the proxy and the middleware
	// ask an OpenAI-style stream for its usage (see Serve).
	StreamUsage bool
}

// UnsettledCost is what a request charged estimate (in the limit's
// units: a Match's Request.Cost, scaled by scale) is charged when its
// response states no usable cost: unsettled_cost, scaled alike, and
// never less than the estimate. A response may fail to state it
// because the client made it so (a stream that carries no usage, an
// encoding nothing here reads, a connection dropped before the last
// event), so the charge must not be what the client asked for.
func (s *Source) UnsettledCost(estimate, scale float64) float64 {
	return max(estimate, s.Unsettled*scale)
}

// String returns settle_from as written.
func (s *Source) String() string { return s.Text }

// Parse reads a settle_from value; the error says what is wrong with it.
func Parse(v string) (*Source, error) {
	const want = "must be header:NAME, trailer:NAME, body:PATH (a JSON path such as usage.total_tokens) or caller"
	if v == "caller" {
		return &Source{Kind: Caller, Text: v}, nil
	}
	kind, name, ok := strings.Cut(v, ":")
	s := &Source{Text: v}
	switch {
	case !ok || name == "":
	case kind == "header" || kind == "trailer":
		if !validHeaderName(name) {
			return nil, errors.New("the header name " + strconv.Quote(name) + " is not a valid HTTP field name")
		}
		s.Kind, s.Name = Header, http.CanonicalHeaderKey(name)
		if kind == "trailer" {
			s.Kind = Trailer
		}
		return s, nil
	case kind == "body":
		path, err := ParsePath(name)
		if err != nil {
			return nil, err
		}
		s.Kind, s.Path = Body, path
		return s, nil
	}
	return nil, errors.New(want + " (got " + strconv.Quote(v) + ")")
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// ParsePath splits a JSON path of object keys ("usage.total_tokens"), as
// settle_from's and cost_source's body:PATH write it.
func ParsePath(p string) ([]string, error) {
	segs := strings.Split(p, ".")
	if len(segs) > maxPathSegments {
		return nil, errors.New("the JSON path " + strconv.Quote(p) + " has more than " + strconv.Itoa(maxPathSegments) + " keys")
	}
	for _, s := range segs {
		if s == "" || strings.TrimSpace(s) != s {
			return nil, errors.New("the JSON path " + strconv.Quote(p) + " must be object keys joined by dots, such as usage.total_tokens")
		}
	}
	return segs, nil
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
func (s *Source) FromHeader(h http.Header) (float64, bool) { return largest(h.Values(s.Name)) }

// FromJSON reads the actual cost at s's path in one JSON document. A key
// given more than once counts its largest usable value. ok is false when
// data is not one well-formed JSON value or holds no number >= 0 there.
func (s *Source) FromJSON(data []byte) (float64, bool) {
	vals, ok := Values(data, s.Path)
	if !ok {
		return 0, false
	}
	return largest(vals)
}

// largest is the largest of vals that ParseActual reads.
func largest(vals []string) (best float64, found bool) {
	for _, v := range vals {
		if f, ok := ParseActual(v); ok && (!found || f > best) {
			best, found = f, true
		}
	}
	return best, found
}

// Values returns the text of every number at path in the JSON document
// data, and of every string there quoted as JSON ("" for another value),
// each one of a key given more than once at any level, in any case (Go's
// encoding/json matches keys so: TestAttackBodyCostCaseFoldedDuplicate);
// ok is false when data is not exactly one well-formed JSON value, or
// nests deeper than maxJSONDepth. It reads data as Python's json.loads reads bytes (see
// asPython), token by token, keeping no tree: the memory it takes is its
// depth.
func Values(data []byte, path []string) (vals []string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(asPython(data)))
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
			if f.depth >= 0 && f.depth < len(path) && strings.EqualFold(k, path[f.depth]) {
				f.next = f.depth + 1
			}
			continue
		}
		if depth() == len(path) {
			v := ""
			switch tok := tok.(type) {
			case json.Number:
				v = tok.String()
			case string:
				v = strconv.Quote(tok)
			}
			vals = append(vals, v)
		}
		valueDone()
	}
}

// asPython returns data as Python's json.loads reads bytes, as model
// servers read requests (FastAPI's request.json()): decoded from UTF-16
// or UTF-32, which it detects by a byte order mark or the zero bytes of
// the first characters, without a UTF-8 byte order mark, and with its
// NaN, Infinity and -Infinity, numbers to it, as null (no usable cost). A
// body Go's reader refused there would pay default_cost, whatever the
// cost the upstream reads (TestAttackBodyCostReadAsPythonReadsIt).
func asPython(b []byte) []byte {
	var order binary.ByteOrder = binary.BigEndian
	width := 0
	switch {
	case bytes.HasPrefix(b, []byte{0xef, 0xbb, 0xbf}):
		b = b[3:]
	case bytes.HasPrefix(b, []byte{0, 0, 0xfe, 0xff}):
		width, b = 4, b[4:]
	case bytes.HasPrefix(b, []byte{0xff, 0xfe, 0, 0}):
		width, order, b = 4, binary.LittleEndian, b[4:]
	case bytes.HasPrefix(b, []byte{0xfe, 0xff}):
		width, b = 2, b[2:]
	case bytes.HasPrefix(b, []byte{0xff, 0xfe}):
		width, order, b = 2, binary.LittleEndian, b[2:]
	case len(b) >= 4 && b[0] == 0:
		width = 4 - 2*min(int(b[1]), 1)
	case len(b) >= 4 && b[1] == 0:
		width, order = 4-2*min(int(b[2])+int(b[3]), 1), binary.LittleEndian
	}
	if width > 0 {
		if len(b)%width != 0 {
			return nil // Python cannot decode it either
		}
		u := make([]uint16, 0, len(b)/2)
		for i := 0; i < len(b); i += width {
			if width == 2 {
				u = append(u, order.Uint16(b[i:]))
			} else {
				u = utf16.AppendRune(u, rune(order.Uint32(b[i:])))
			}
		}
		b = []byte(string(utf16.Decode(u)))
	}
	if !bytes.Contains(b, []byte("NaN")) && !bytes.Contains(b, []byte("Infinity")) {
		return b
	}
	out := make([]byte, 0, len(b))
	inString, escaped := false, false
next:
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case escaped:
			escaped = false
		case inString:
			inString, escaped = c != '"', c == '\\'
		case c == '"':
			inString = true
		default:
			for _, w := range []string{"NaN", "Infinity", "-Infinity"} {
				if bytes.HasPrefix(b[i:], []byte(w)) {
					out, i = append(out, "null"...), i+len(w)-1
					continue next
				}
			}
		}
		out = append(out, b[i])
	}
	return out
}
