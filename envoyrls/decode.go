package envoyrls

import (
	"unicode/utf8"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// decodeRequest decodes a RateLimitRequest as Envoy sends it, without
// protobuf's reflection, into req, which is empty: the domain, the
// descriptors with their entries, hits_addend and is_negative_hits, each
// field with its own wire type and each message field at most once. It
// reports false, leaving req empty, for any other message (a descriptor's
// limit override, an unknown or repeated field, a string that is not
// UTF-8, a malformed one): proto.Unmarshal decides those, so that what a
// call means never depends on which decoder read it (FuzzDecodeRequest).
//
// The descriptors and entries are allocated together rather than one by
// one, and the strings of a small message share one copy of its bytes:
// what a call costs in allocations is a handful, whatever its shape
// (BenchmarkDecodeRequest). A string kept past the call (a key the
// insight rankings hold) keeps that copy alive, which is why only a
// message of at most sharedText bytes shares one.
func decodeRequest(b []byte, req *rlspb.RateLimitRequest) bool {
	var n shape
	if !n.scan(b) {
		return false
	}
	d := decoder{b: b}
	if len(b) <= sharedText {
		d.text = string(b)
	}
	var descs []rlv3.RateLimitDescriptor
	var entries []rlv3.RateLimitDescriptor_Entry
	var dptrs []*rlv3.RateLimitDescriptor
	var eptrs []*rlv3.RateLimitDescriptor_Entry
	if n.descriptors == 1 && n.entries == 1 {
		// The usual call, in one allocation.
		one := new(oneEntry)
		descs, entries, dptrs, eptrs = one.d[:], one.e[:], one.dp[:], one.ep[:]
	} else {
		descs = make([]rlv3.RateLimitDescriptor, n.descriptors)
		entries = make([]rlv3.RateLimitDescriptor_Entry, n.entries)
		dptrs = make([]*rlv3.RateLimitDescriptor, n.descriptors)
		eptrs = make([]*rlv3.RateLimitDescriptor_Entry, n.entries)
	}
	for i := range descs {
		dptrs[i] = &descs[i]
	}
	for i := range entries {
		eptrs[i] = &entries[i]
	}
	req.Descriptors = dptrs
	di, ei := 0, 0
	for off := 0; off < len(b); {
		num, typ, v, s, next := field(b, off)
		switch {
		case num == 1:
			req.Domain = d.str(s)
		case num == 2:
			desc := &descs[di]
			first := ei
			for o := s.from; o < s.to; {
				num, typ, v, es, next := field(b, o)
				switch {
				case num == 1:
					e := &entries[ei]
					ei++
					for eo := es.from; eo < es.to; {
						num, _, _, fs, next := field(b, eo)
						if num == 1 {
							e.Key = d.str(fs)
						} else {
							e.Value = d.str(fs)
						}
						eo = next
					}
				case num == 3:
					h := &wrapperspb.UInt64Value{}
					for ho := es.from; ho < es.to; {
						_, _, hv, _, next := field(b, ho)
						h.Value = hv
						ho = next
					}
					desc.HitsAddend = h
				case num == 4 && typ == protowire.VarintType:
					desc.IsNegativeHits = protowire.DecodeBool(v)
				}
				o = next
			}
			if ei > first {
				desc.Entries = eptrs[first:ei:ei]
			}
			di++
		case num == 3 && typ == protowire.VarintType:
			req.HitsAddend = uint32(v)
		}
		off = next
	}
	if n.descriptors == 0 {
		req.Descriptors = nil
	}
	return true
}

// crowded reports whether b holds field (2: a request's descriptors) more
// than most times, or a descriptor more than maxEntries entries: an empty
// one is two bytes sent and some eighty decoded, so it is refused unread.
func crowded(b []byte, field protowire.Number, most int) bool {
	for n := 0; len(b) > 0; {
		num, typ, t := protowire.ConsumeTag(b)
		l := protowire.ConsumeFieldValue(num, typ, b[max(t, 0):])
		if t < 0 || l < 0 {
			return false // malformed: the decoder refuses it
		}
		if v, _ := protowire.ConsumeBytes(b[t:]); num == field && typ == protowire.BytesType {
			if n++; n > most || field == 2 && crowded(v, 1, maxEntries) {
				return true
			}
		}
		b = b[t+l:]
	}
	return false
}

// oneEntry is a request's one descriptor of one entry.
type oneEntry struct {
	d  [1]rlv3.RateLimitDescriptor
	e  [1]rlv3.RateLimitDescriptor_Entry
	dp [1]*rlv3.RateLimitDescriptor
	ep [1]*rlv3.RateLimitDescriptor_Entry
}

// sharedText is the largest message whose strings share one copy.
const sharedText = 1024

// span is the bytes of a length-delimited field's value.
type span struct{ from, to int }

// field reads the field at b[off:], which scan has checked: its number,
// wire type, value (a varint's) or bytes (a length-delimited one's), and
// where the next field starts.
func field(b []byte, off int) (protowire.Number, protowire.Type, uint64, span, int) {
	num, typ, n := protowire.ConsumeTag(b[off:])
	off += n
	if typ == protowire.VarintType {
		v, n := protowire.ConsumeVarint(b[off:])
		return num, typ, v, span{}, off + n
	}
	v, n := protowire.ConsumeBytes(b[off:])
	start := off + n - len(v)
	return num, typ, 0, span{start, start + len(v)}, off + n
}

// decoder makes the strings of one message.
type decoder struct {
	b    []byte
	text string // the message's bytes as one string, when it is small
}

func (d *decoder) str(s span) string {
	if d.text != "" {
		return d.text[s.from:s.to]
	}
	return string(d.b[s.from:s.to])
}

// shape is what scan found in a message it can decode.
type shape struct{ descriptors, entries int }

// scan checks that b is a message decodeRequest decodes, and counts its
// descriptors and entries.
func (n *shape) scan(b []byte) bool {
	for len(b) > 0 {
		num, typ, v, rest, ok := next(b)
		if !ok {
			return false
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			if !utf8.Valid(v) {
				return false
			}
		case num == 2 && typ == protowire.BytesType:
			n.descriptors++
			if !n.descriptor(v) {
				return false
			}
		case num == 3 && typ == protowire.VarintType:
		default:
			return false
		}
		b = rest
	}
	return true
}

func (n *shape) descriptor(b []byte) bool {
	hits := false
	for len(b) > 0 {
		num, typ, v, rest, ok := next(b)
		if !ok {
			return false
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			n.entries++
			if !scanEntry(v) {
				return false
			}
		case num == 3 && typ == protowire.BytesType && !hits:
			hits = true
			for len(v) > 0 {
				num, typ, _, r, ok := next(v)
				if !ok || num != 1 || typ != protowire.VarintType {
					return false
				}
				v = r
			}
		case num == 4 && typ == protowire.VarintType:
		default:
			return false
		}
		b = rest
	}
	return true
}

func scanEntry(b []byte) bool {
	for len(b) > 0 {
		num, typ, v, rest, ok := next(b)
		if !ok || (num != 1 && num != 2) || typ != protowire.BytesType || !utf8.Valid(v) {
			return false
		}
		b = rest
	}
	return true
}

// next reads the first field of b: its number and wire type, its value
// for a varint or bytes field, and the rest of b. It reports false for a
// malformed field, an invalid field number and any other wire type.
func next(b []byte) (num protowire.Number, typ protowire.Type, v, rest []byte, ok bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, nil, nil, false
	}
	b = b[n:]
	switch typ {
	case protowire.VarintType:
		_, n = protowire.ConsumeVarint(b)
		if n < 0 {
			return 0, 0, nil, nil, false
		}
		v = b[:n]
	case protowire.BytesType:
		v, n = protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, 0, nil, nil, false
		}
	default:
		return 0, 0, nil, nil, false
	}
	return num, typ, v, b[n:], true
}
