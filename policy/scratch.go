package policy

import (
	"net/http"

	"github.com/sluicehq/sluice"
)

// Scratch is room for one request's decision: its Input, its matches,
// its verdict's results and its calls to the store. A server that decides
// request after request keeps Scratches in a sync.Pool, one per request
// in flight, and its decisions allocate none of that: what a Scratch's
// methods return lives in it, and stays valid until it is Cleared or used
// for another request. The zero value is ready to use.
type Scratch struct {
	in        Input
	matches   []Match
	results   []Result
	charged   []sluice.Charged
	decisions []sluice.Decision
}

// FromForwardAuth is Policy.FromForwardAuth describing the request in s.
func (s *Scratch) FromForwardAuth(p *Policy, r *http.Request, prefix string) (*Input, error) {
	if err := p.fromForwardAuth(&s.in, r, prefix); err != nil {
		return nil, err
	}
	return &s.in, nil
}

// FromHTTP is Policy.FromHTTP describing r in s.
func (s *Scratch) FromHTTP(p *Policy, r *http.Request) *Input {
	p.fromHTTP(&s.in, r)
	return &s.in
}

// Match is Policy.Match with the matches in s.
func (s *Scratch) Match(p *Policy, in *Input) ([]Match, error) {
	ms, err := p.AppendMatch(s.matches[:0], in)
	s.matches = ms[:0]
	return ms, err
}

// Matches returns room in s for n matches of the caller's making (the
// decision API names its limits itself).
func (s *Scratch) Matches(n int) []Match {
	if cap(s.matches) < n {
		s.matches = make([]Match, 0, n)
	}
	return s.matches[:n]
}

// Clear drops what s refers to (keys, headers, limits), so that a pooled
// Scratch keeps nothing of its last request alive, and keeps its room.
func (s *Scratch) Clear() {
	s.in = Input{}
	clear(s.matches[:cap(s.matches)])
	s.matches = s.matches[:0]
	clear(s.results[:cap(s.results)])
	s.results = s.results[:0]
	clear(s.charged[:cap(s.charged)])
	clear(s.decisions[:cap(s.decisions)])
}
