package settle

import "bytes"

// sseReader reads an event stream (text/event-stream, as the HTML
// standard defines it) as it passes, one event at a time, keeping the
// value at each path of the last event whose data is JSON with a number
// there. It holds one event at most, bounded by maxEventBytes: a longer
// event, or line, is skipped whole.
type sseReader struct {
	paths   []*Source
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

func newSSEReader(paths []*Source) *sseReader {
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
