package httpgate

// Charging what was used, in the reverse proxy and the middleware: a rule
// charges an estimate before the request goes on (its cost_source, which
// may read a field of the JSON request body), and once the response has
// been written, the actual cost it states (settle_from: a header, a
// trailer, or a number in its JSON body or in the last event of its event
// stream that carries one) settles the charge (sluice.Limiter.Settle). A
// response that states no cost that can be used (none, one in an encoding
// not read here, a stream cut short, an error) is charged the rule's
// unsettled_cost instead: what the client can make a response leave out
// must not be what decides its charge.

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/policy"
)

// Defaults of the settlement options.
const (
	// DefaultSettleTTL is how long a settlement handle may be used.
	DefaultSettleTTL = time.Hour
	// DefaultBodyMemory bounds the request bodies held at once for
	// body:PATH costs.
	DefaultBodyMemory = 64 << 20
)

// Bounds on what a response is read for its actual cost. Nothing beyond
// them is held; a response that says its cost past them states none, and
// its request is charged the rule's unsettled_cost.
const (
	// settleBodyLimit bounds a JSON response body (compressed and
	// decompressed alike).
	settleBodyLimit = 1 << 20
	// maxEventBytes bounds one event of an event stream (its data lines
	// together, and each line).
	maxEventBytes = 64 << 10
)

// settleState is what a Gate keeps for settlements.
type settleState struct {
	// key signs the decision API's handles when the policy names no
	// settle_secret_env: random, so they are good in this process only.
	key [32]byte
	// bodyFree is the memory left for request bodies (Options.BodyMemory).
	bodyFree atomic.Int64
	// info caches what the policy in force settles.
	info atomic.Pointer[settleInfo]
	// nonces spends the decision API's handles (see nonceLimit).
	nonces *sluice.Limit
}

// settleInfo is what one policy asks of requests and responses.
type settleInfo struct {
	pol       *policy.Policy
	readsBody bool
	headers   []string // settle_from headers and trailers, dropped from requests
}

func (g *Gate) initSettle() {
	if g.opts.SettleTTL <= 0 {
		g.opts.SettleTTL = DefaultSettleTTL
	}
	if g.opts.BodyMemory <= 0 {
		g.opts.BodyMemory = DefaultBodyMemory
	}
	g.settle.bodyFree.Store(g.opts.BodyMemory)
	g.settle.nonces = nonceLimit(g.opts.SettleTTL)
	if _, err := rand.Read(g.settle.key[:]); err != nil {
		panic("httpgate: no randomness for the settlement key: " + err.Error())
	}
}

// settleFor returns what p settles, computed once per policy.
func (g *Gate) settleFor(p *policy.Policy) *settleInfo {
	if si := g.settle.info.Load(); si != nil && si.pol == p {
		return si
	}
	si := &settleInfo{pol: p, readsBody: p.ReadsBody(), headers: p.SettleHeaders()}
	g.settle.info.Store(si)
	return si
}

// prepareSettle readies r for p's settlements before it is decided: it
// drops from r the headers and trailers that settle_from reads from
// responses (a client must not state its own cost to an upstream that
// echoes them), and reads the body into in.Body when a cost_source reads
// it. The function it returns gives the body's memory back; call it once
// the request is done.
func (g *Gate) prepareSettle(r *http.Request, p *policy.Policy, in *policy.Input) func() {
	si := g.settleFor(p)
	for _, h := range si.headers {
		r.Header.Del(h)
		r.Trailer.Del(h)
	}
	if !si.readsBody {
		return func() {}
	}
	return g.readCostBody(r, in)
}

// readCostBody reads up to policy.CostBodyLimit bytes of r's body into
// in.Body, and puts them back in front of the rest, so that the handler
// (or the upstream) reads the body whole. A body declared or found longer
// than the limit is not parsed (in.Body stays nil: the rule's
// default_cost), nor is one when the bodies already held use up
// Options.BodyMemory: a client cannot buy a cheaper charge, or the
// server's memory, with a large body.
func (g *Gate) readCostBody(r *http.Request, in *policy.Input) func() {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength > policy.CostBodyLimit {
		return func() {}
	}
	want := int64(policy.CostBodyLimit + 1)
	if r.ContentLength >= 0 {
		want = r.ContentLength + 1
	}
	if g.settle.bodyFree.Add(-want) < 0 {
		g.settle.bodyFree.Add(want)
		return func() {}
	}
	release := func() { g.settle.bodyFree.Add(want) }
	orig := r.Body
	buf := make([]byte, 0, min(want, 64<<10))
	buf, err := readUpTo(orig, buf, int(want))
	r.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(buf), &errReader{orig: orig, err: err}), Closer: orig}
	if err == nil && len(buf) <= policy.CostBodyLimit && len(buf) > 0 {
		in.Body = buf
	}
	return release
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

// settling lists the results of v that settle from the response: the
// limits that charged the request (admitted, the store answered) and
// whose settle_from a response states.
func settling(v *policy.Verdict) []*policy.Result {
	var out []*policy.Result
	if !v.Allowed {
		return nil
	}
	for i := range v.Results {
		r := &v.Results[i]
		if s := r.Match.Settle; s != nil && s.Kind != policy.SettleCaller && r.Decision.Allowed && r.StoreErr == nil {
			out = append(out, r)
		}
	}
	return out
}

// serveSettled serves r with next and then settles the limits of v that
// settle from the response, each with the actual cost the response
// states, or, when it states none that can be used, with the rule's
// unsettled_cost (never less than the estimate). body is the request
// body as read for its cost (nil when not read). The settlement is made
// however next ends: httputil.ReverseProxy panics with
// http.ErrAbortHandler when the client leaves mid-stream, and that
// request must be charged too.
func (g *Gate) serveSettled(next http.Handler, w http.ResponseWriter, r *http.Request, v *policy.Verdict, body []byte) {
	rs := settling(v)
	if len(rs) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	askReadable(r, rs, body)
	sw := newSettleWriter(w, rs)
	defer func() {
		p := recover()
		sw.finish(p != nil)
		g.settleAll(r, rs, sw)
		if p != nil {
			panic(p)
		}
	}()
	next.ServeHTTP(sw, r)
}

// settleAll settles each of rs at what sw read of the response.
func (g *Gate) settleAll(r *http.Request, rs []*policy.Result, sw *settleWriter) {
	ctx, cancel := deadline.WithTimeout(context.WithoutCancel(r.Context()), g.opts.StoreTimeout)
	defer cancel()
	for i, res := range rs {
		// An adaptive rate charges in scaled units (policy.Match.Scale):
		// the actual cost is scaled alike.
		scale := res.Match.Scale()
		actual, why := sw.actual(i)
		if why == "" {
			g.settleOne(ctx, res.Match.Request, actual*scale)
			continue
		}
		charge := max(res.Match.Settle.UnsettledCost(res.Match.Request.Cost, scale), actual*scale)
		g.opts.Logger.Debug("unsettled", "limit", res.Match.Request.Limit.Name(), "key", res.Match.Request.Key, "why", why, "charge", charge)
		g.settleOne(ctx, res.Match.Request, charge)
	}
}

// askReadable asks for a response whose cost can be read, for a request
// that rs settle from its body: in an encoding the settleWriter decodes
// (identity: a client's Accept-Encoding of br or deflate would have the
// upstream answer in one it cannot read, and it would be charged
// unsettled_cost), and, when a rule sets stream_usage: include and the
// body is an OpenAI-style streaming request, with the stream's usage
// (see includeStreamUsage). The rewritten body replaces r's whole.
func askReadable(r *http.Request, rs []*policy.Result, body []byte) {
	usage := false
	for _, res := range rs {
		if s := res.Match.Settle; s.Kind == policy.SettleBody {
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

// settleOne settles req, charged req.Cost, at actual, logging what was
// done (and a store's failure, which leaves the estimate charged).
func (g *Gate) settleOne(ctx context.Context, req sluice.Request, actual float64) (sluice.Settlement, error) {
	charged := req.Cost
	if charged == 0 {
		charged = 1
	}
	s, err := g.lim.Settle(ctx, req, charged, actual)
	if err != nil {
		g.storeLog.Log(g.opts.Logger, req.Limit.Name(), req.Key, err, false)
		return s, err
	}
	g.opts.Logger.Debug("settled", "limit", req.Limit.Name(), "key", req.Key, "charged", charged, "actual", actual,
		"refunded", s.Refunded, "extra", s.Extra, "forgiven", s.Forgiven)
	return s, nil
}

// settleWriter passes a response through while reading the actual costs
// it states: the settle_from headers as the response's headers are sent,
// its trailers once it ends, and its body (JSON, held up to
// settleBodyLimit, or an event stream, read event by event) as it is
// written. It holds nothing else back: every write goes on at once.
type settleWriter struct {
	http.ResponseWriter
	rs []*policy.Result

	wroteHeader bool
	noBody      bool            // a status that has no body (HEAD answers too)
	announced   map[string]bool // trailers announced in the Trailer header

	wantBody bool
	encoding string // "" or "gzip"; another leaves the body unread
	sse      *sseReader
	json     []byte
	over     bool // the JSON body went past settleBodyLimit

	status int    // the status sent
	broken bool   // a write failed, or the handler was aborted: the response was cut short
	whole  []bool // per result: its cost was read from a response known to have ended (see actual)

	actuals []float64
	found   []bool
}

func newSettleWriter(w http.ResponseWriter, rs []*policy.Result) *settleWriter {
	sw := &settleWriter{ResponseWriter: w, rs: rs, actuals: make([]float64, len(rs)), found: make([]bool, len(rs)), whole: make([]bool, len(rs))}
	for _, r := range rs {
		sw.wantBody = sw.wantBody || r.Match.Settle.Kind == policy.SettleBody
	}
	return sw
}

// Unwrap lets http.ResponseController reach the connection (Hijack for
// upgrades, deadlines).
func (sw *settleWriter) Unwrap() http.ResponseWriter { return sw.ResponseWriter }

// Flush sends what was written, as the underlying writer does.
func (sw *settleWriter) Flush() { _ = sw.FlushError() }

// FlushError is Flush reporting the underlying writer's error.
func (sw *settleWriter) FlushError() error {
	if !sw.wroteHeader {
		sw.WriteHeader(http.StatusOK)
	}
	err := http.NewResponseController(sw.ResponseWriter).Flush()
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		sw.broken = true
	}
	return err
}

func (sw *settleWriter) WriteHeader(code int) {
	if !sw.wroteHeader && code >= 200 {
		sw.wroteHeader = true
		sw.snapshot(code)
	}
	sw.ResponseWriter.WriteHeader(code)
}

// snapshot reads the response's headers as they are sent: the settle_from
// headers, the announced trailers, and how its body is to be read.
func (sw *settleWriter) snapshot(code int) {
	sw.status = code
	h := sw.Header()
	for i, r := range sw.rs {
		if s := r.Match.Settle; s.Kind == policy.SettleHeader {
			sw.actuals[i], sw.found[i] = s.FromHeader(h)
		}
	}
	for _, line := range h.Values("Trailer") {
		for _, name := range strings.Split(line, ",") {
			if name = strings.TrimSpace(name); name != "" {
				if sw.announced == nil {
					sw.announced = map[string]bool{}
				}
				sw.announced[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	sw.noBody = code == http.StatusNoContent || code == http.StatusNotModified
	if !sw.wantBody || sw.noBody {
		sw.wantBody = false
		return
	}
	switch enc := strings.ToLower(strings.TrimSpace(h.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		sw.encoding = "gzip"
	default:
		sw.wantBody = false // compressed in a way not read here: no settlement
		return
	}
	if mt, _, _ := mime.ParseMediaType(h.Get("Content-Type")); mt == "text/event-stream" {
		if sw.encoding != "" {
			sw.wantBody = false // a compressed stream is not read as it passes
			return
		}
		var paths []*policy.SettleFrom
		for _, r := range sw.rs {
			if r.Match.Settle.Kind == policy.SettleBody {
				paths = append(paths, r.Match.Settle)
			}
		}
		sw.sse = newSSEReader(paths)
	}
}

func (sw *settleWriter) Write(b []byte) (int, error) {
	if !sw.wroteHeader {
		sw.WriteHeader(http.StatusOK)
	}
	if sw.wantBody {
		switch {
		case sw.sse != nil:
			sw.sse.Write(b)
		case !sw.over && len(sw.json)+len(b) <= settleBodyLimit:
			sw.json = append(sw.json, b...)
		default:
			sw.over, sw.json = true, nil
		}
	}
	n, err := sw.ResponseWriter.Write(b)
	if err != nil {
		sw.broken = true
	}
	return n, err
}

// finish reads, once the handler has returned (or was aborted), what the
// response states: its trailers and its body's costs.
func (sw *settleWriter) finish(aborted bool) {
	sw.broken = sw.broken || aborted
	if !sw.wroteHeader {
		// Nothing written: the server sends the headers as they stand.
		sw.wroteHeader = true
		sw.snapshot(http.StatusOK)
	}
	h := sw.Header()
	var body []byte
	if sw.wantBody && sw.sse == nil && !sw.over {
		body = sw.json
		if sw.encoding == "gzip" {
			body = gunzip(body)
		}
	}
	k := 0 // index among the body sources, for the event stream's values
	for i, r := range sw.rs {
		s := r.Match.Settle
		switch s.Kind {
		case policy.SettleTrailer:
			// A trailer set after the headers were sent, or announced in
			// Trailer and set once the body is done (as
			// httputil.ReverseProxy copies an upstream's).
			if v, ok := s.FromHeader(http.Header{s.Name: trailerValues(h, s.Name)}); ok {
				sw.actuals[i], sw.found[i] = v, true
			} else if sw.announced[s.Name] {
				sw.actuals[i], sw.found[i] = s.FromHeader(h)
			}
		case policy.SettleBody:
			switch {
			case sw.sse != nil:
				sw.actuals[i], sw.found[i] = sw.sse.vals[k], sw.sse.found[k]
				sw.whole[i] = sw.sse.done
			case body != nil:
				// A JSON document that parses was read to its end.
				sw.actuals[i], sw.found[i] = s.FromJSON(body)
				sw.whole[i] = true
			}
			k++
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

// actual is the cost the response stated for result i, and why it is
// not to be used ("" when it is): the response stated none, was cut
// short (the client left, or the handler was aborted: what the upstream
// went on to use after what was read is unknown), or is an error, whose
// body an upstream may fill with what the request sent. The cost is
// what was read, zero when nothing was. A response cut short after it
// had ended, as far as its cost goes, is not cut short: a JSON body read
// whole, or an event stream past its "data: [DONE]" (a client that stops
// reading there, as OpenAI's do, may hang up before the proxy has read
// the end of the upstream's body).
func (sw *settleWriter) actual(i int) (float64, string) {
	switch {
	case sw.broken && !(sw.found[i] && sw.whole[i]):
		return sw.actuals[i], "cut short"
	case sw.status >= 400:
		return 0, "error status"
	case !sw.found[i]:
		return 0, "no cost stated"
	}
	return sw.actuals[i], ""
}

// gunzip decompresses a gzip body of at most settleBodyLimit bytes; nil
// when it is not gzip or decompresses to more.
func gunzip(b []byte) []byte {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil
	}
	out, err := io.ReadAll(io.LimitReader(zr, settleBodyLimit+1))
	if err != nil || len(out) > settleBodyLimit {
		return nil
	}
	return out
}

// sseReader reads an event stream (text/event-stream, as the HTML
// standard defines it) as it passes, one event at a time, keeping the
// value at each path of the last event whose data is JSON with a number
// there. It holds one event at most, bounded by maxEventBytes: a longer
// event, or line, is skipped whole.
type sseReader struct {
	paths   []*policy.SettleFrom
	vals    []float64
	found   []bool
	line    []byte // the line being read
	skip    bool   // the line being read went past the bound
	data    []byte // the event's data lines, joined by '\n'
	hasData bool
	over    bool // the event went past the bound
	lastCR  bool // the last byte was '\r', which a '\n' may follow
	done    bool // an event "data: [DONE]" came after the last cost read
}

func newSSEReader(paths []*policy.SettleFrom) *sseReader {
	return &sseReader{paths: paths, vals: make([]float64, len(paths)), found: make([]bool, len(paths))}
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
	case bytes.HasPrefix(line, []byte("data")):
		v, ok := field(line, "data")
		if !ok {
			return
		}
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

// field returns the value of a "name: value" or "name:value" line of the
// field name, or of "name" alone (an empty value).
func field(line []byte, name string) ([]byte, bool) {
	rest := line[len(name):]
	switch {
	case len(rest) == 0:
		return nil, true
	case rest[0] != ':':
		return nil, false // another field that starts alike ("database")
	}
	rest = rest[1:]
	if len(rest) > 0 && rest[0] == ' ' {
		rest = rest[1:]
	}
	return rest, true
}

// dispatch ends an event: its data, when JSON, may state the costs.
func (s *sseReader) dispatch() {
	if s.hasData && !s.over {
		if string(s.data) == "[DONE]" {
			s.done = true
		}
		for i, p := range s.paths {
			if v, ok := p.FromJSON(s.data); ok {
				s.vals[i], s.found[i], s.done = v, true, false
			}
		}
	}
	s.data, s.hasData, s.over = s.data[:0], false, false
}
