package httpgate

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"sync"
)

// The decision API's common call, one take answered with one decision,
// is read and written here without encoding/json's reflection, which
// cost more than the decision itself. Both sides hold to encoding/json's
// bytes: parseSimpleTake reads only a plain subset of JSON and leaves
// every other body to decodeJSON, and appendDecision writes exactly what
// json.Marshal writes (FuzzSimpleTake and FuzzAppendDecision check both
// against encoding/json).

// parseSimpleTake reads a body of one take, such as
// {"rule":"api","key":"user-1","cost":2}: an object of the fields rule,
// key, cost and reserve, each at most once and spelled so, whose strings
// are printable ASCII without escapes, whose cost is a number that
// float64 holds and whose reserve is true or false. ok is false for any
// other body, which decodeJSON then reads (and explains what is wrong
// with); for the ones it reads, req is what decodeJSON decodes. known,
// when not nil, returns the rule's name as a string already held (""
// when it holds none), which spares making one.
func parseSimpleTake(data []byte, known func([]byte) string) (req TakeRequest, ok bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return req, false
	}
	var seen [4]bool
	for {
		i = skipSpace(data, i+1)
		a, b, ok := plainString(data, i)
		if !ok {
			return req, false
		}
		i = skipSpace(data, b+1)
		if i >= len(data) || data[i] != ':' {
			return req, false
		}
		i = skipSpace(data, i+1)
		f := -1
		switch string(data[a:b]) {
		case "rule", "key":
			s, e, ok := plainString(data, i)
			if !ok {
				return req, false
			}
			if data[a] == 'r' {
				f = 0
				if known != nil {
					req.Rule = known(data[s:e])
				}
				if req.Rule == "" {
					req.Rule = string(data[s:e])
				}
			} else {
				f, req.Key = 1, string(data[s:e])
			}
			i = e + 1
		case "cost":
			e := jsonNumber(data, i)
			if e < 0 {
				return req, false
			}
			c, err := strconv.ParseFloat(string(data[i:e]), 64)
			if err != nil {
				return req, false
			}
			f, req.Cost, i = 2, &c, e
		case "reserve":
			switch {
			case hasWord(data, i, "true"):
				f, req.Reserve, i = 3, true, i+4
			case hasWord(data, i, "false"):
				f, req.Reserve, i = 3, false, i+5
			default:
				return req, false
			}
		default:
			return req, false
		}
		if seen[f] {
			return req, false
		}
		seen[f] = true
		i = skipSpace(data, i)
		if i >= len(data) {
			return req, false
		}
		switch data[i] {
		case ',':
			continue
		case '}':
			return req, skipSpace(data, i+1) == len(data)
		}
		return req, false
	}
}

// skipSpace returns the index of the first byte of data from i on that
// is not JSON whitespace.
func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at data[i] made of printable ASCII
// without escapes: its content is data[a:b], and data[b] its closing
// quote.
func plainString(data []byte, i int) (a, b int, ok bool) {
	if i >= len(data) || data[i] != '"' {
		return 0, 0, false
	}
	for j := i + 1; j < len(data); j++ {
		if c := data[j]; !plainByte[c] {
			if c == '"' {
				return i + 1, j, true
			}
			return 0, 0, false
		}
	}
	return 0, 0, false
}

// plainByte and asIsByte are the bytes plainString reads within a string
// (printable ASCII but the quote and the backslash) and the ones
// appendString writes as they are (those, less what encoding/json escapes
// for HTML: <, >, &), looked up rather than compared one by one.
var plainByte, asIsByte = func() (plain, asIs [256]bool) {
	for c := 0x20; c <= 0x7e; c++ {
		plain[c] = c != '"' && c != '\\'
		asIs[c] = plain[c] && c != '<' && c != '>' && c != '&'
	}
	return plain, asIs
}()

// jsonNumber returns the end of the JSON number at data[i], -1 when there
// is none: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func jsonNumber(data []byte, i int) int {
	digits := func(j int) int {
		for j < len(data) && data[j] >= '0' && data[j] <= '9' {
			j++
		}
		return j
	}
	if i < len(data) && data[i] == '-' {
		i++
	}
	switch {
	case i >= len(data):
		return -1
	case data[i] == '0':
		i++
	case data[i] >= '1' && data[i] <= '9':
		i = digits(i)
	default:
		return -1
	}
	if i < len(data) && data[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

// hasWord reports whether data holds w at i.
func hasWord(data []byte, i int, w string) bool {
	return len(data)-i >= len(w) && string(data[i:i+len(w)]) == w
}

// appendDecision appends d as json.Marshal encodes it. ok is false when
// json.Marshal would fail (a number that is not finite), for the caller to
// answer as writeJSON does.
func appendDecision(b []byte, d *DecisionResponse) (_ []byte, ok bool) {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = strconv.AppendInt(append(b, `,"limit":`...), d.Limit, 10)
	b = strconv.AppendInt(append(b, `,"remaining":`...), d.Remaining, 10)
	if b, ok = appendFloat(append(b, `,"tokens":`...), d.Tokens); !ok {
		return b, false
	}
	b = strconv.AppendInt(append(b, `,"retry_after_ms":`...), d.RetryAfterMs, 10)
	b = strconv.AppendInt(append(b, `,"reset_after_ms":`...), d.ResetAfterMs, 10)
	b = appendString(append(b, `,"rule":`...), d.Rule)
	if d.RetryAt != "" {
		b = appendString(append(b, `,"retry_at":`...), d.RetryAt)
	}
	b = appendString(append(b, `,"reason":`...), d.Reason)
	if d.Key != "" {
		b = appendString(append(b, `,"key":`...), d.Key)
	}
	if d.Shadow {
		b = append(b, `,"shadow":true`...)
	}
	if d.StoreError {
		b = append(b, `,"store_error":true`...)
	}
	if d.Lease != "" {
		b = appendString(append(b, `,"lease":`...), d.Lease)
	}
	if d.LeaseMs != 0 {
		b = strconv.AppendInt(append(b, `,"lease_ms":`...), d.LeaseMs, 10)
	}
	if len(d.Takes) > 0 {
		b = append(b, `,"takes":[`...)
		for i := range d.Takes {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendDecision(b, &d.Takes[i]); !ok {
				return b, false
			}
		}
		b = append(b, ']')
	}
	if d.Settle != "" {
		b = appendString(append(b, `,"settle":`...), d.Settle)
	}
	return append(b, '}'), true
}

// appendFloat appends f as encoding/json writes a float64: the shortest
// decimal that reads back as f, in exponent form below 1e-6 and from
// 1e21 on, with an exponent of at least one digit ("1e-7", not "1e-07").
func appendFloat(b []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	// A whole number below 2^53 (the usual count of tokens) is its own
	// shortest decimal: every whole number there is a float64, so no
	// fewer digits name it. -0 is written "-0", as AppendFloat does.
	if t := math.Trunc(f); t == f && math.Abs(f) < 1<<53 && (f != 0 || !math.Signbit(f)) {
		return strconv.AppendInt(b, int64(f), 10), true
	}
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}

// appendString appends s as a JSON string as encoding/json writes it:
// printable ASCII as it is, except the quote, the backslash and the
// characters it escapes for HTML (<, >, &); any other string goes
// through encoding/json itself.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if !asIsByte[s[i]] {
			// A copy: s itself then stays off the heap, and so does
			// what holds it (the answer being written).
			q, _ := json.Marshal(strings.Clone(s)) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// bufPool holds the buffers that bodies are read into and answers
// written from, for the length of one request.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// maxPooledBuf bounds the buffers kept for reuse: a rare large body
// should not pin its memory in the pool.
const maxPooledBuf = 16 << 10

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) <= maxPooledBuf {
		*b = (*b)[:0]
		bufPool.Put(b)
	}
}
