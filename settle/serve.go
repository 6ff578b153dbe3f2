package settle

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// Bounds on what a response is read for its actual cost. Nothing beyond
// them is held; a response that says its cost past them states none, and
// its request is charged the rule's unsettled_cost.
const (
	// bodyLimit bounds a JSON response body, compressed and decompressed:
	// each buffer's capacity, not only its length.
	bodyLimit = 1 << 20
	// firstBuffer is the least a JSON body's buffer starts at when its
	// length was not declared; it doubles from there, up to bodyLimit.
	firstBuffer = 4 << 10
	// maxEventBytes bounds one event of an event stream (its data lines
	// together, and each line).
	maxEventBytes = 64 << 10
)

// Serve serves r with next through a Recorder of sources, and calls done
// with it once the response has been written: done settles each source
// at what the Recorder read (Recorder.Actual). body is the request body
// as read for its cost (nil when not read); a stream_usage source may
// have r ask for the stream's usage with it. done is called however next
// ends: httputil.ReverseProxy panics with http.ErrAbortHandler when the
// client leaves mid-stream, and that request must be charged too; the
// panic then goes on.
//
// A JSON body is held, to read its cost once it has ended, in mem, for
// client (who sent r, "" when not known), as ReadBody holds request
// bodies: a client whose requests have the upstream answer large JSON,
// read slowly, must not make the server hold a buffer for each response
// in flight with no bound in all, nor take another client's share. A
// response that does not fit is passed on whole and unread: it states no
// cost, as one too large does, and is charged the rule's unsettled_cost.
func Serve(next http.Handler, w http.ResponseWriter, r *http.Request, sources []*Source, body []byte, mem *BodyMemory, client string, done func(*Recorder)) {
	n := len(sources)
	rec := &Recorder{ResponseWriter: w, sources: sources, actuals: make([]float64, n), found: make([]bool, n), whole: make([]bool, n)}
	rec.json = heldBytes{mem: mem, client: client}
	rec.wantBody = askReadable(r, sources, body)
	defer func() {
		p := recover()
		rec.finish(p != nil)
		done(rec)
		if p != nil {
			panic(p)
		}
	}()
	next.ServeHTTP(rec, r)
}

// Recorder passes a response through while reading the actual costs it
// states: the settle_from headers as the response's headers are sent,
// its trailers once it ends, and its body (JSON, held up to bodyLimit
// within the memory Serve was given, or an event stream, read event by
// event) as it is written. It holds nothing else back: every write goes
// on at once.
type Recorder struct {
	http.ResponseWriter
	sources []*Source

	wroteHeader bool
	announced   map[string]bool // trailers announced in the Trailer header

	wantBody bool
	encoding string // "" or "gzip"; another leaves the body unread
	sse      *sseReader
	json     heldBytes
	declared int  // the JSON body's Content-Length, when declared within bodyLimit
	over     bool // the JSON body went past bodyLimit, or past the memory it may hold

	status int    // the status sent
	broken bool   // a write failed, or the handler was aborted: the response was cut short
	whole  []bool // per source: its cost was read from a response known to have ended (see Actual)

	actuals []float64
	found   []bool
}

// Unwrap lets http.ResponseController reach the connection (Hijack for
// upgrades, deadlines).
func (rec *Recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

// Flush sends what was written, as the underlying writer does.
func (rec *Recorder) Flush() { _ = rec.FlushError() }

// FlushError is Flush reporting the underlying writer's error.
func (rec *Recorder) FlushError() error {
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	err := http.NewResponseController(rec.ResponseWriter).Flush()
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		rec.broken = true
	}
	return err
}

// WriteHeader reads the response's headers as they are sent.
func (rec *Recorder) WriteHeader(code int) {
	if !rec.wroteHeader && code >= 200 {
		rec.wroteHeader = true
		rec.snapshot(code)
	}
	rec.ResponseWriter.WriteHeader(code)
}

// snapshot reads the response's headers as they are sent: the settle_from
// headers, the announced trailers, and how its body is to be read.
func (rec *Recorder) snapshot(code int) {
	rec.status = code
	h := rec.Header()
	for i, s := range rec.sources {
		if s.Kind == Header {
			rec.actuals[i], rec.found[i] = s.FromHeader(h)
		}
	}
	for _, line := range h.Values("Trailer") {
		for _, name := range strings.Split(line, ",") {
			if rec.announced == nil {
				rec.announced = map[string]bool{}
			}
			rec.announced[http.CanonicalHeaderKey(strings.TrimSpace(name))] = true
		}
	}
	// A status that has no body (HEAD answers too) states no cost in one.
	if !rec.wantBody || code == http.StatusNoContent || code == http.StatusNotModified {
		rec.wantBody = false
		return
	}
	// A declared length sizes the buffer once, when it is first written
	// to (a HEAD answer's, never written, holds nothing); a body longer
	// than it grows on as one undeclared. One past bodyLimit is not held
	// at all.
	if cl, err := strconv.ParseInt(h.Get("Content-Length"), 10, 64); err == nil && cl >= 0 {
		if cl > bodyLimit {
			rec.over = true
		} else {
			rec.declared = int(cl)
		}
	}
	switch enc := strings.ToLower(strings.TrimSpace(h.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		rec.encoding = "gzip"
	default:
		rec.wantBody = false // compressed in a way not read here: no settlement
		return
	}
	if mt, _, _ := mime.ParseMediaType(h.Get("Content-Type")); mt == "text/event-stream" {
		if rec.encoding != "" {
			rec.wantBody = false // a compressed stream is not read as it passes
			return
		}
		rec.sse = &sseReader{sources: rec.sources, vals: rec.actuals, found: rec.found}
	}
}

// Write reads b for the costs of the body, and passes it on.
func (rec *Recorder) Write(b []byte) (int, error) {
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.wantBody {
		switch {
		case rec.sse != nil:
			rec.sse.Write(b)
		case !rec.over && rec.json.grow(len(b), rec.declared):
			rec.json.b = append(rec.json.b, b...)
		default:
			rec.over = true
			rec.json.release()
		}
	}
	n, err := rec.ResponseWriter.Write(b)
	if err != nil {
		rec.broken = true
	}
	return n, err
}

// finish reads, once the handler has returned (or was aborted), what the
// response states: its trailers and its body's costs.
func (rec *Recorder) finish(aborted bool) {
	rec.broken = rec.broken || aborted
	if !rec.wroteHeader {
		// Nothing written: the server sends the headers as they stand.
		rec.wroteHeader = true
		rec.snapshot(http.StatusOK)
	}
	h := rec.Header()
	var body []byte
	// The decompressed body is held beside the compressed one, in the same
	// memory.
	unzipped := heldBytes{mem: rec.json.mem, client: rec.json.client}
	defer rec.json.release()
	defer unzipped.release()
	if rec.wantBody && rec.sse == nil && !rec.over {
		body = rec.json.b
		if rec.encoding == "gzip" {
			body = gunzip(body, &unzipped)
		}
	}
	for i, s := range rec.sources {
		switch s.Kind {
		case Trailer:
			// A trailer set after the headers were sent, or announced in
			// Trailer and set once the body is done (as
			// httputil.ReverseProxy copies an upstream's).
			if v, ok := largest(trailerValues(h, s.Name)); ok {
				rec.actuals[i], rec.found[i] = v, true
			} else if rec.announced[s.Name] {
				rec.actuals[i], rec.found[i] = s.FromHeader(h)
			}
		case Body:
			switch {
			case rec.sse != nil: // its values are read as it passes
				rec.whole[i] = rec.sse.done
			case body != nil:
				// A JSON document that parses was read to its end.
				rec.actuals[i], rec.found[i] = s.FromJSON(body)
				rec.whole[i] = true
			}
		}
	}
}

// trailerValues returns the values of the trailer name that a handler set
// with http.TrailerPrefix, in any case.
func trailerValues(h http.Header, name string) []string {
	var out []string
	for k, vs := range h {
		if len(k) == len(http.TrailerPrefix)+len(name) && strings.EqualFold(k, http.TrailerPrefix+name) {
			out = append(out, vs...)
		}
	}
	return out
}

// Actual is the cost the response stated for source i, and why it is not
// to be used ("" when it is): the response stated none, was cut short
// (the client left, or the handler was aborted: what the upstream went on
// to use after what was read is unknown), or is an error, whose body an
// upstream may fill with what the request sent. The cost is what was
// read, zero when nothing was. A response cut short after it had ended,
// as far as its cost goes, is not cut short: a JSON body read whole, or
// an event stream past its "data: [DONE]" (a client that stops reading
// there, as OpenAI's do, may hang up before the proxy has read the end of
// the upstream's body).
func (rec *Recorder) Actual(i int) (float64, string) {
	switch {
	case rec.broken && !(rec.found[i] && rec.whole[i]):
		return rec.actuals[i], "cut short"
	case rec.status >= 400:
		return 0, "error status"
	case !rec.found[i]:
		return 0, "no cost stated"
	}
	return rec.actuals[i], ""
}

// gunzip decompresses a gzip body of at most bodyLimit bytes into out;
// nil when it is not gzip, decompresses to more, or does not fit the
// memory out holds.
func gunzip(b []byte, out *heldBytes) []byte {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil
	}
	for {
		if len(out.b) == cap(out.b) && !out.grow(1, 0) {
			if len(out.b) < bodyLimit {
				return nil // the memory is spent
			}
			// bodyLimit bytes, whole when no byte more is there.
			var one [1]byte
			if _, err := io.ReadFull(zr, one[:]); err == io.EOF {
				return out.b
			}
			return nil
		}
		n, err := zr.Read(out.b[len(out.b):cap(out.b)])
		out.b = out.b[:len(out.b)+n]
		switch {
		case err == io.EOF:
			return out.b
		case err != nil:
			return nil
		}
	}
}

// heldBytes is a buffer whose capacity is held in a BodyMemory for a
// client: it grows only by what take reserved, never past bodyLimit, so
// that what the memory counts is what the buffers hold.
type heldBytes struct {
	mem    *BodyMemory
	client string
	b      []byte
	held   int64 // reserved in mem: cap(b)
}

// grow makes room in h.b for n bytes more, reporting whether they fit
// bodyLimit and the memory. A new buffer is made at size when that is
// enough (a declared length), or else at twice the last, and what it
// adds is reserved before it is made. The last, dropped once copied, is
// garbage like any other: what is counted is what the buffers hold.
func (h *heldBytes) grow(n, size int) bool {
	need := len(h.b) + n
	if need > bodyLimit {
		return false
	}
	if need <= cap(h.b) {
		return true
	}
	c := min(max(need, 2*cap(h.b), firstBuffer), bodyLimit)
	if size >= need && h.b == nil {
		c = size
	}
	if !h.mem.take(h.client, int64(c)-h.held) {
		return false
	}
	b := make([]byte, len(h.b), c)
	copy(b, h.b)
	h.b, h.held = b, int64(c)
	return true
}

// release drops the buffer and gives its memory back; it may be called
// again.
func (h *heldBytes) release() {
	if h.held > 0 {
		h.mem.give(h.client, h.held)
	}
	h.b, h.held = nil, 0
}

// sseReader reads an event stream (text/event-stream, as the HTML
// standard defines it) as it passes, one event at a time, keeping in
// vals and found, for each Body source, the value at its path of the last
// event whose data is JSON with a number there. It holds one event at
// most, bounded by maxEventBytes: a longer event, or line, is skipped
// whole, and leaves no cost found, as it may have stated a later one (so
// does an event whose data is not JSON that can be read, but "[DONE]").
type sseReader struct {
	sources []*Source
	vals    []float64 // the Recorder's, by source
	found   []bool
	line    []byte // the line being read
	skip    bool   // the line being read went past the bound
	data    []byte // the event's data lines, joined by '\n'
	hasData bool
	over    bool // the event went past the bound
	lastCR  bool // the last byte was '\r', which a '\n' may follow
	done    bool // an event "data: [DONE]" came after the last cost read
}

// Write reads b, a piece of the stream.
func (s *sseReader) Write(b []byte) {
	for len(b) > 0 {
		if s.lastCR && b[0] == '\n' {
			b = b[1:] // "\r\n" ends one line
			s.lastCR = false
			continue
		}
		s.lastCR = false
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			s.addLine(b)
			return
		}
		s.addLine(b[:i])
		s.lastCR = b[i] == '\r'
		s.endLine()
		b = b[i+1:]
	}
}

func (s *sseReader) addLine(b []byte) {
	if s.skip {
		return
	}
	if len(s.line)+len(b) > maxEventBytes {
		s.skip, s.line = true, s.line[:0]
		return
	}
	s.line = append(s.line, b...)
}

func (s *sseReader) endLine() {
	line, skipped := s.line, s.skip
	s.line, s.skip = s.line[:0], false
	switch {
	case skipped:
		s.over = true // a line too long: its event is not read
	case len(line) == 0:
		s.dispatch()
	case string(line) == "data" || bytes.HasPrefix(line, []byte("data:")):
		// "data: value", "data:value" or "data" alone (an empty value); not
		// another field that starts alike ("database").
		v := bytes.TrimPrefix(bytes.TrimPrefix(line[len("data"):], []byte(":")), []byte(" "))
		if s.over || len(s.data)+len(v)+1 > maxEventBytes {
			s.over, s.data = true, s.data[:0]
			return
		}
		if s.hasData {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, v...)
		s.hasData = true
	}
}

// dispatch ends an event: its data, when JSON, may state the costs. One
// not read (past its bound, or not JSON read here, as when nested too
// deep; "[DONE]" aside) may have stated later ones than those read before.
func (s *sseReader) dispatch() {
	end := !s.over && string(s.data) == "[DONE]"
	s.done = s.done || end
	for i, p := range s.sources {
		if p.Kind != Body || !(s.hasData || s.over) || end {
			continue
		}
		vals, ok := Values(s.data, p.Path)
		if v, found := largest(vals); s.over || !ok {
			s.found[i] = false
		} else if found {
			s.vals[i], s.found[i], s.done = v, true, false
		}
	}
	s.data, s.hasData, s.over = s.data[:0], false, false
}

// ReadBody reads up to limit bytes of r's body for a body:PATH cost, and
// puts them back in front of the rest, so that the handler (or the
// upstream) reads the body whole. A body declared or found longer than
// limit is not returned (nil: the rule's default_cost), nor is one that
// does not fit in mem, the memory for the bodies held at once, in all and
// for client (who sent r, "" when not known): a client cannot buy a
// cheaper charge, the server's memory, or another client's reading, with
// large bodies. release gives the memory back; call it once the request
// is done, however it ends.
func ReadBody(r *http.Request, limit int64, mem *BodyMemory, client string) (body []byte, release func()) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength > limit {
		return nil, func() {}
	}
	want := limit + 1
	if r.ContentLength >= 0 {
		want = r.ContentLength + 1
	}
	if !mem.take(client, want) {
		return nil, func() {}
	}
	// Once: a second call would give back memory that other bodies hold.
	var once sync.Once
	release = func() { once.Do(func() { mem.give(client, want) }) }
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

// askReadable asks for a response whose cost can be read: never an
// upgraded connection (a websocket), which states no cost and carries
// what the client likes for as long as it likes
// (TestAttackUpgradeEscapesSettlement), and, for a request that sources
// settle from its body, one in an encoding the Recorder decodes
// (identity: a client's Accept-Encoding of br or deflate would have the
// upstream answer in one it cannot read, and it would be charged
// unsettled_cost), and, when a source sets stream_usage: include and the
// body is an OpenAI-style streaming request, with the stream's usage
// (see includeStreamUsage). The rewritten body replaces r's whole. It
// reports whether a source reads the response's body.
func askReadable(r *http.Request, sources []*Source, body []byte) (readsBody bool) {
	r.Header.Del("Upgrade")
	usage := false
	for _, s := range sources {
		if s.Kind == Body {
			r.Header.Set("Accept-Encoding", "identity")
			readsBody, usage = true, usage || s.StreamUsage
		}
	}
	if !usage || body == nil {
		return readsBody
	}
	nb, ok := includeStreamUsage(body)
	if !ok {
		return true
	}
	r.Body = &replayBody{Reader: bytes.NewReader(nb), Closer: r.Body}
	r.ContentLength = int64(len(nb))
	r.TransferEncoding = nil
	r.Header.Set("Content-Length", strconv.Itoa(len(nb)))
	return true
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
