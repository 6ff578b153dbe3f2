package envoyrls

import (
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// decodeCases are encodings of RateLimitRequest: those Envoy sends, and
// those the codec must leave to proto.Unmarshal (fields repeated, unknown
// or of another wire type, a limit override, strings that are not UTF-8,
// truncated messages).
func decodeCases() map[string][]byte {
	marshal := func(m *rlspb.RateLimitRequest) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		return b
	}
	entry := func(k, v string) *rlv3.RateLimitDescriptor_Entry {
		return &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	usual := marshal(&rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{entry("user", "user-42")}}}})
	tag := func(num protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(nil, num, typ) }
	bytesField := func(num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	desc := func(parts ...[]byte) []byte { return bytesField(2, cat(parts...)) }
	ent := func(k, v string) []byte {
		return bytesField(1, cat(bytesField(1, []byte(k)), bytesField(2, []byte(v))))
	}
	return map[string][]byte{
		"empty":       {},
		"usual":       usual,
		"domain only": marshal(&rlspb.RateLimitRequest{Domain: "d"}),
		"every field": marshal(&rlspb.RateLimitRequest{Domain: "edge", HitsAddend: 7, Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{entry("remote_address", "10.0.0.1"), entry("path", "/ü")}, HitsAddend: wrapperspb.UInt64(0), IsNegativeHits: true},
			{Entries: []*rlv3.RateLimitDescriptor_Entry{entry("k", "")}, HitsAddend: wrapperspb.UInt64(1 << 50)},
			{},
		}}),
		"long values": marshal(&rlspb.RateLimitRequest{Domain: strings.Repeat("d", 600), Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{entry("k", strings.Repeat("v", 900))}}}}),
		"limit override": marshal(&rlspb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{entry("k", "v")},
			Limit:   &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE},
		}}}),
		"domain twice":             cat(bytesField(1, []byte("a")), usual),
		"hits twice":               cat(usual, tag(3, protowire.VarintType), []byte{5}, tag(3, protowire.VarintType), []byte{0x80, 0x80, 0x80, 0x80, 0x10}),
		"descriptor hits twice":    cat(bytesField(1, []byte("d")), desc(ent("k", "v"), bytesField(3, []byte{8, 3}), bytesField(3, []byte{8, 4}))),
		"wrapper value twice":      cat(bytesField(1, []byte("d")), desc(ent("k", "v"), bytesField(3, []byte{8, 3, 8, 9}))),
		"empty wrapper":            cat(bytesField(1, []byte("d")), desc(ent("k", "v"), bytesField(3, nil))),
		"key twice":                cat(bytesField(1, []byte("d")), desc(bytesField(1, cat(bytesField(1, []byte("a")), bytesField(1, []byte("b")))))),
		"empty entry":              cat(bytesField(1, []byte("d")), desc(bytesField(1, nil))),
		"negative hits as 2":       cat(bytesField(1, []byte("d")), desc(ent("k", "v"), tag(4, protowire.VarintType), []byte{2})),
		"unknown field":            cat(usual, tag(9, protowire.VarintType), []byte{1}),
		"unknown descriptor field": cat(bytesField(1, []byte("d")), desc(ent("k", "v"), bytesField(7, []byte("x")))),
		"domain as varint":         cat(tag(1, protowire.VarintType), []byte{1}),
		"hits as bytes":            cat(usual, bytesField(3, []byte{1})),
		"fixed32 field":            cat(usual, tag(3, protowire.Fixed32Type), []byte{1, 0, 0, 0}),
		"group":                    cat(usual, tag(5, protowire.StartGroupType), tag(5, protowire.EndGroupType)),
		"field number 0":           cat(tag(0, protowire.VarintType), []byte{1}),
		"not UTF-8 domain":         bytesField(1, []byte{0xff}),
		"not UTF-8 value":          cat(bytesField(1, []byte("d")), desc(ent("k", "\xc3"))),
		"truncated":                usual[:len(usual)-3],
		"length past the end":      append(tag(1, protowire.BytesType), 40, 'a'),
		"varint overflow":          cat(tag(3, protowire.VarintType), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}),
		"hits past uint32":         cat(usual, tag(3, protowire.VarintType), protowire.AppendVarint(nil, 1<<33+5)),
	}
}

// TestDecodeRequestAgreesWithProto: whatever the codec is given, it
// decodes what proto.Unmarshal decodes, or fails where it fails.
func TestDecodeRequestAgreesWithProto(t *testing.T) {
	decoded := 0
	for name, b := range decodeCases() {
		t.Run(name, func(t *testing.T) {
			if agree(t, b) {
				decoded++
			}
		})
	}
	if decoded < 8 {
		t.Errorf("decodeRequest decoded %d of the cases itself; the usual ones should not fall back", decoded)
	}
	if !decodeRequest(decodeCases()["usual"], &rlspb.RateLimitRequest{}) {
		t.Error("the usual request fell back to proto.Unmarshal")
	}
}

// FuzzDecodeRequest holds decodeRequest to proto.Unmarshal on any bytes.
func FuzzDecodeRequest(f *testing.F) {
	for _, b := range decodeCases() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { agree(t, b) })
}

// agree checks the codec's decoding of b against proto.Unmarshal's, and
// reports whether decodeRequest decoded it itself.
func agree(t *testing.T, b []byte) bool {
	t.Helper()
	want := &rlspb.RateLimitRequest{}
	wantErr := proto.Unmarshal(b, want)
	got := &rlspb.RateLimitRequest{}
	gotErr := newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("codec error %v, proto.Unmarshal's %v", gotErr, wantErr)
	}
	if wantErr == nil && !proto.Equal(got, want) {
		t.Fatalf("codec decoded %v, proto.Unmarshal %v", got, want)
	}
	fast := &rlspb.RateLimitRequest{}
	if !decodeRequest(b, fast) {
		return false
	}
	if wantErr != nil || !proto.Equal(fast, want) {
		t.Fatalf("decodeRequest decoded %v where proto.Unmarshal decoded %v (error %v)", fast, want, wantErr)
	}
	return true
}

// BenchmarkDecodeRequest decodes the usual request by the codec, and by
// proto.Unmarshal for comparison.
func BenchmarkDecodeRequest(b *testing.B) {
	data := decodeCases()["usual"]
	c := newCodec()
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, new(rlspb.RateLimitRequest)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(data, new(rlspb.RateLimitRequest)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
