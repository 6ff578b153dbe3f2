package settle

// What settlement asks of a request before it goes on: its body read for
// a body:PATH cost, and put back whole; a response it can read.

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
)

// ReadBody reads up to limit bytes of r's body for a body:PATH cost, and
// puts them back in front of the rest, so that the handler (or the
// upstream) reads the body whole. A body declared or found longer than
// limit is not returned (nil: the rule's default_cost), nor is one when
// the bodies already held use up free, the memory left for them, which
// it takes from: a client cannot buy a cheaper charge, or the server's
// memory, with a large body. release gives the memory back; call it once
// the request is done.
func ReadBody(r *http.Request, limit int64, free *atomic.Int64) (body []byte, release func()) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength > limit {
		return nil, func() {}
	}
	want := limit + 1
	if r.ContentLength >= 0 {
		want = r.ContentLength + 1
	}
	if free.Add(-want) < 0 {
		free.Add(want)
		return nil, func() {}
	}
	release = func() { free.Add(want) }
	orig := r.Body
	buf := make([]byte, 0, min(want, 64<<10))
	buf, err := readUpTo(orig, buf, int(want))
	r.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(buf), &errReader{orig: orig, err: err}), Closer: orig}
	if err == nil && int64(len(buf)) <= limit && len(buf) > 0 {
		return buf, release
	}
	return nil, release
}

// readUpTo appends to buf from r until r ends, fails, or buf holds n
// bytes. io.EOF is no error.
func readUpTo(r io.Reader, buf []byte, n int) ([]byte, error) {
	for len(buf) < n {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		m, err := r.Read(buf[len(buf):min(cap(buf), n)])
		buf = buf[:len(buf)+m]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// replayBody is a request body read in part already: what was read, then
// the rest.
type replayBody struct {
	io.Reader
	io.Closer
}

// errReader reads the rest of a body after what was read of it, or the
// error its reading met.
type errReader struct {
	orig io.Reader
	err  error
}

func (e *errReader) Read(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return e.orig.Read(p)
}

// askReadable asks for a response whose cost can be read, for a request
// that sources settle from its body: in an encoding the Recorder decodes
// (identity: a client's Accept-Encoding of br or deflate would have the
// upstream answer in one it cannot read, and it would be charged
// unsettled_cost), and, when a source sets stream_usage: include and the
// body is an OpenAI-style streaming request, with the stream's usage
// (see includeStreamUsage). The rewritten body replaces r's whole.
func askReadable(r *http.Request, sources []*Source, body []byte) {
	usage := false
	for _, s := range sources {
		if s.Kind == Body {
			r.Header.Set("Accept-Encoding", "identity")
			usage = usage || s.StreamUsage
		}
	}
	if !usage || body == nil {
		return
	}
	nb, ok := includeStreamUsage(body)
	if !ok {
		return
	}
	r.Body = &replayBody{Reader: bytes.NewReader(nb), Closer: r.Body}
	r.ContentLength = int64(len(nb))
	r.TransferEncoding = nil
	r.Header.Set("Content-Length", strconv.Itoa(len(nb)))
}

// includeStreamUsage rewrites an OpenAI-style request body that asks for
// a stream ("stream": true) so that the stream ends with its usage:
// stream_options.include_usage set to true, every other member kept, in
// order and as written (only the space between them goes). ok is false,
// and the body is to be sent as it is, when it asks
// for no stream, has the option already, or is not one JSON object whose
// members (and stream_options' members) are each named once: a body that
// upstreams could read two ways is not rewritten one way. The result is
// at most len(body) plus the 40 bytes of the member added.
func includeStreamUsage(body []byte) ([]byte, bool) {
	top, ok := jsonMembers(body)
	if !ok {
		return nil, false
	}
	stream, hasOpts := -1, -1
	for i, m := range top {
		switch m.key {
		case "stream":
			stream = i
		case "stream_options":
			hasOpts = i
		}
	}
	if stream < 0 || string(bytes.TrimSpace(top[stream].val)) != "true" {
		return nil, false
	}
	want := jsonMember{key: "include_usage", raw: []byte(`"include_usage"`), val: []byte("true")}
	switch {
	case hasOpts < 0:
		top = append(top, jsonMember{key: "stream_options", raw: []byte(`"stream_options"`), val: []byte(`{"include_usage":true}`)})
	default:
		opts, ok := jsonMembers(top[hasOpts].val)
		if !ok {
			if string(bytes.TrimSpace(top[hasOpts].val)) != "null" {
				return nil, false
			}
			opts = nil
		}
		found := false
		for i := range opts {
			if opts[i].key == want.key {
				if string(bytes.TrimSpace(opts[i].val)) == "true" {
					return nil, false
				}
				opts[i], found = want, true
			}
		}
		if !found {
			opts = append(opts, want)
		}
		top[hasOpts].val = joinMembers(opts)
	}
	return joinMembers(top), true
}

// jsonMember is one member of a JSON object: its key, decoded and as
// written, and its value as written.
type jsonMember struct {
	key string
	raw []byte
	val json.RawMessage
}

// jsonMembers splits data, one JSON object, into its members in order;
// ok is false when data is anything else, or names a member twice.
func jsonMembers(data []byte) ([]jsonMember, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var out []jsonMember
	seen := map[string]bool{}
	for dec.More() {
		from := dec.InputOffset()
		tok, err := dec.Token()
		k, isKey := tok.(string)
		if err != nil || !isKey || seen[k] {
			return nil, false
		}
		seen[k] = true
		// The key as written: from its opening quote, after the space and
		// comma before it, to where the decoder stands.
		raw := data[from:dec.InputOffset()]
		raw = raw[bytes.IndexByte(raw, '"'):]
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		out = append(out, jsonMember{key: k, raw: raw, val: v})
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // more after the object
	}
	return out, true
}

// joinMembers writes members as one JSON object.
func joinMembers(ms []jsonMember) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(m.raw)
		b.WriteByte(':')
		b.Write(m.val)
	}
	b.WriteByte('}')
	return b.Bytes()
}
