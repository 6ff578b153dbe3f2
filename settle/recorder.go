package settle

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
)

// Bounds on what a response is read for its actual cost. Nothing beyond
// them is held; a response that says its cost past them states none, and
// its request is charged the rule's unsettled_cost.
const (
	// bodyLimit bounds a JSON response body (compressed and decompressed
	// alike).
	bodyLimit = 1 << 20
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
func Serve(next http.Handler, w http.ResponseWriter, r *http.Request, sources []*Source, body []byte, done func(*Recorder)) {
	askReadable(r, sources, body)
	rec := NewRecorder(w, sources)
	defer func() {
		p := recover()
		rec.Finish(p != nil)
		done(rec)
		if p != nil {
			panic(p)
		}
	}()
	next.ServeHTTP(rec, r)
}

// Recorder passes a response through while reading the actual costs it
// states: the settle_from headers as the response's headers are sent,
// its trailers once it ends, and its body (JSON, held up to bodyLimit, or
// an event stream, read event by event) as it is written. It holds
// nothing else back: every write goes on at once.
type Recorder struct {
	http.ResponseWriter
	sources []*Source

	wroteHeader bool
	noBody      bool            // a status that has no body (HEAD answers too)
	announced   map[string]bool // trailers announced in the Trailer header

	wantBody bool
	encoding string // "" or "gzip"; another leaves the body unread
	sse      *sseReader
	json     []byte
	over     bool // the JSON body went past bodyLimit

	status int    // the status sent
	broken bool   // a write failed, or the handler was aborted: the response was cut short
	whole  []bool // per source: its cost was read from a response known to have ended (see Actual)

	actuals []float64
	found   []bool
}

// NewRecorder returns a Recorder of the costs that sources read from the
// response written to it, which it passes on to w.
func NewRecorder(w http.ResponseWriter, sources []*Source) *Recorder {
	rec := &Recorder{ResponseWriter: w, sources: sources, actuals: make([]float64, len(sources)), found: make([]bool, len(sources)), whole: make([]bool, len(sources))}
	for _, s := range sources {
		rec.wantBody = rec.wantBody || s.Kind == Body
	}
	return rec
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
			if name = strings.TrimSpace(name); name != "" {
				if rec.announced == nil {
					rec.announced = map[string]bool{}
				}
				rec.announced[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	rec.noBody = code == http.StatusNoContent || code == http.StatusNotModified
	if !rec.wantBody || rec.noBody {
		rec.wantBody = false
		return
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
		var paths []*Source
		for _, s := range rec.sources {
			if s.Kind == Body {
				paths = append(paths, s)
			}
		}
		rec.sse = newSSEReader(paths)
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
		case !rec.over && len(rec.json)+len(b) <= bodyLimit:
			rec.json = append(rec.json, b...)
		default:
			rec.over, rec.json = true, nil
		}
	}
	n, err := rec.ResponseWriter.Write(b)
	if err != nil {
		rec.broken = true
	}
	return n, err
}

// Finish reads, once the handler has returned (or was aborted), what the
// response states: its trailers and its body's costs.
func (rec *Recorder) Finish(aborted bool) {
	rec.broken = rec.broken || aborted
	if !rec.wroteHeader {
		// Nothing written: the server sends the headers as they stand.
		rec.wroteHeader = true
		rec.snapshot(http.StatusOK)
	}
	h := rec.Header()
	var body []byte
	if rec.wantBody && rec.sse == nil && !rec.over {
		body = rec.json
		if rec.encoding == "gzip" {
			body = gunzip(body)
		}
	}
	k := 0 // index among the body sources, for the event stream's values
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
			case rec.sse != nil:
				rec.actuals[i], rec.found[i] = rec.sse.vals[k], rec.sse.found[k]
				rec.whole[i] = rec.sse.done
			case body != nil:
				// A JSON document that parses was read to its end.
				rec.actuals[i], rec.found[i] = s.FromJSON(body)
				rec.whole[i] = true
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

// gunzip decompresses a gzip body of at most bodyLimit bytes; nil when it
// is not gzip or decompresses to more.
func gunzip(b []byte) []byte {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil
	}
	out, err := io.ReadAll(io.LimitReader(zr, bodyLimit+1))
	if err != nil || len(out) > bodyLimit {
		return nil
	}
	return out
}
