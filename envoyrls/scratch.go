package envoyrls

import (
	"slices"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/policy"
)

// scratch is the working memory of one call, kept for the next one
// (scratchPool) rather than allocated per call: nothing in it outlives
// the call, and nothing the response holds is in it.
type scratch struct {
	found   []Found                  // per descriptor, what applies to it
	entries []policy.DescriptorEntry // one descriptor's entries, for policy.Input
	in      policy.Input
	ms      []policy.Match    // the matches of every descriptor (found[i].Limits)
	groups  [3]policy.Scratch // each group's decision: its results, its store calls
	parts   policy.Parts      // the call's answer, as respond gathers it
	// The call's plan (see plan). Kept here rather than on the stack:
	// a worker goroutine whose stack the collector has shrunk while it
	// waited would grow it again, copying it, on each call that needed
	// room for them.
	ds   []descState
	plan []policy.Match
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// getScratch returns a scratch with found sized for n descriptors.
func getScratch(n int) *scratch {
	sc := scratchPool.Get().(*scratch)
	sc.found = slices.Grow(sc.found[:0], n)[:n]
	return sc
}

// release gives sc back. What the call left in it is overwritten by the
// next one, not cleared: clearing memory that holds pointers costs a write
// barrier per word while the collector runs, and the pool itself drops sc
// within two collections, with whatever it still points to. The groups'
// policy.Scratch are given back as a Scratch is, cleared.
func (sc *scratch) release() {
	sc.found, sc.entries, sc.ms = sc.found[:0], sc.entries[:0], sc.ms[:0]
	sc.ds, sc.plan = sc.ds[:0], sc.plan[:0]
	for k := range sc.groups {
		sc.groups[k].Clear()
	}
	sc.in = policy.Input{}
	scratchPool.Put(sc)
}

// matchInto fills sc.found for req with m: with sc's buffers when m is
// one of this package's matchers, else with m.Match.
func matchInto(m Matcher, req *rlspb.RateLimitRequest, sc *scratch) error {
	switch m := m.(type) {
	case rules:
		return m.matchInto(req, sc)
	case *Reference:
		return m.matchInto(req, sc)
	}
	return m.Match(req, sc.found)
}

// response is a response to a call of one descriptor (the usual) with its
// status, in one allocation.
type response struct {
	resp     rlspb.RateLimitResponse
	statuses [1]*rlspb.RateLimitResponse_DescriptorStatus
	blocks   [1]statusBlock
}

// admittedFields is how many RateLimit headers the default sets (draft
// and trio) give an admitted call; a rejected one gets three more
// (Retry-After, X-Sluice-Reason, Cache-Control).
const (
	admittedFields = 5
	rejectedFields = admittedFields + 3
)

// limitedResponse is a response with room for the headers of an admitted
// call under the default sets, for a call that finds limits: the headers
// come in the same allocation.
type limitedResponse struct {
	response
	headers [admittedFields]*corev3.HeaderValue
	values  [admittedFields]corev3.HeaderValue
}

// recycledResponse is a limitedResponse with room for a rejected call's
// headers too: recycled memory, allocated once for many calls, so that a
// rejection, as common as an admission under load, needs no allocation
// of its own for them either.
type recycledResponse struct {
	response
	headers [rejectedFields]*corev3.HeaderValue
	values  [rejectedFields]corev3.HeaderValue
}

// recycled is a response to a call of one descriptor whose memory goes
// back to recycledPool once codec.Marshal has marshalled it: the server's
// own handler (see Register) answers with one where nothing can see the
// response after it is marshalled. To any other codec it is the response
// it embeds.
type recycled struct {
	*rlspb.RateLimitResponse
	mem recycledResponse
	// req is the call's request, decoded into the same memory: nothing
	// reads it once the call is answered.
	req rlspb.RateLimitRequest
}

var recycledPool = sync.Pool{New: func() any { return new(recycled) }}

// release gives r back, for another call's response.
func (r *recycled) release() {
	r.RateLimitResponse = nil
	recycledPool.Put(r)
}

// newResponse returns an OK response for n descriptors, with room for
// each one's status in blocks and, when limited (headers are likely), for
// a few headers in room: in into's memory when it is given and n is 1.
func newResponse(n int, limited bool, into *recycled) (_ *rlspb.RateLimitResponse, blocks []statusBlock, room headerRoom) {
	if n != 1 {
		return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, n)}, make([]statusBlock, n), room
	}
	var r *response
	switch {
	case into != nil:
		rr := &into.mem
		*rr = recycledResponse{} // a message's state included: nothing of the last call's
		into.RateLimitResponse = &rr.resp
		r, room = &rr.response, headerRoom{ptrs: rr.headers[:0], values: rr.values[:0]}
	case limited:
		lr := &limitedResponse{}
		r, room = &lr.response, headerRoom{ptrs: lr.headers[:0], values: lr.values[:0]}
	default:
		r = &response{}
	}
	r.resp.OverallCode = rlspb.RateLimitResponse_OK
	r.resp.Statuses = r.statuses[:]
	return &r.resp, r.blocks[:], room
}
