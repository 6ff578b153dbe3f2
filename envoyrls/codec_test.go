package envoyrls

import (
	"bytes"
	"runtime"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// codecMessage is a message the server sees, and whether the codec must
// write the very bytes proto.Marshal writes. A message with a oneof need
// not: the generated code writes its fields in field-number order, proto
// in the order of the Go struct, which puts a oneof where it is declared.
// Either decodes to the same message. None has a map field, so that
// proto.Marshal's bytes are deterministic.
type codecMessage struct {
	name      string
	m         proto.Message
	sameBytes bool
}

// codecMessages are messages with every field set, small and above
// grpc-go's pooling threshold, with and without generated code.
func codecMessages() []codecMessage {
	resp := func(headers int, quota bool) *rlspb.RateLimitResponse {
		r := &rlspb.RateLimitResponse{
			OverallCode: rlspb.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{
				{Code: rlspb.RateLimitResponse_OK, LimitRemaining: 4_000_000_000},
				{
					Code:               rlspb.RateLimitResponse_OVER_LIMIT,
					CurrentLimit:       &rlspb.RateLimitResponse_RateLimit{Name: "per-user", RequestsPerUnit: 100, Unit: rlspb.RateLimitResponse_RateLimit_MINUTE, UnitMultiplier: wrapperspb.UInt32(3)},
					DurationUntilReset: durationpb.New(1500 * time.Millisecond),
				},
			},
			RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "x-raw", RawValue: []byte{0, 1, 2}}},
			RawBody:             []byte("over the limit"),
			DynamicMetadata:     &structpb.Struct{},
		}
		if quota {
			r.Statuses[1].Quota = &rlspb.RateLimitResponse_Quota{Requests: 7, Id: "q", ExpirationSpecifier: &rlspb.RateLimitResponse_Quota_ValidUntil{}}
			r.Quota = &rlspb.RateLimitResponse_Quota{Requests: 1, ExpirationSpecifier: &rlspb.RateLimitResponse_Quota_ValidUntil{}}
		}
		for i := range headers {
			r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "RateLimit-" + strconv.Itoa(i), Value: `"per-user";r=0;t=1`})
		}
		return r
	}
	return []codecMessage{
		{"request", &rlspb.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "ü-42"}}, HitsAddend: wrapperspb.UInt64(0), IsNegativeHits: true},
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: ""}}, Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}},
		}}, true},
		{"response", resp(5, false), true},
		{"empty response", &rlspb.RateLimitResponse{}, true},
		{"large response", resp(100, false), true},
		{"response with quotas", resp(5, true), false},
		{"large response with quotas", resp(100, true), false},
		// No generated code: the proto codec's.
		{"health", &healthpb.HealthCheckRequest{Service: ServiceName}, true},
	}
}

// TestCodecIsProto checks that the codec writes what proto.Marshal writes
// (the same bytes, or the same message in another field order), and reads
// it back, for every message; with the generated code
// compiled in (go test -tags vtprotobuf) for go-control-plane's messages,
// through the proto codec for the rest.
func TestCodecIsProto(t *testing.T) {
	c := newCodec()
	if c.Name() != "proto" {
		t.Errorf("name %q, want proto", c.Name())
	}
	t.Logf("generated marshalling compiled in: %v", vtCompiled)
	for _, cm := range codecMessages() {
		name, m := cm.name, cm.m
		if _, vt := m.(vtMarshaler); vt && !vtCompiled {
			t.Errorf("%s has generated marshalling, but vtCompiled is false", name)
		}
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		data, err := c.Marshal(m)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := data.Materialize(); cm.sameBytes && !bytes.Equal(got, want) {
			t.Errorf("%s: codec wrote %x, proto.Marshal %x", name, got, want)
		}
		back := m.ProtoReflect().New().Interface()
		if err := c.Unmarshal(data, back); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !proto.Equal(back, m) {
			t.Errorf("%s: read back %v, want %v", name, back, m)
		}
		data.Free()
	}
}

// TestCodecRefusesNonMessages checks that what is not a message is an
// error, as with the proto codec, not a panic.
func TestCodecRefusesNonMessages(t *testing.T) {
	c := newCodec()
	if _, err := c.Marshal("not a message"); err == nil {
		t.Error("marshalled a string")
	}
	var s string
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer("x")}, &s); err == nil {
		t.Error("unmarshalled into a string")
	}
}

// BenchmarkCodecMarshal is the server's marshalling of a response as
// sluice answers one descriptor (a status and five RateLimit headers):
// grpc-go's proto codec beside this package's, which differ only in a
// binary built with -tags vtprotobuf.
func BenchmarkCodecMarshal(b *testing.B) {
	resp := &rlspb.RateLimitResponse{
		OverallCode: rlspb.RateLimitResponse_OK,
		Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{
			Code:               rlspb.RateLimitResponse_OK,
			CurrentLimit:       &rlspb.RateLimitResponse_RateLimit{Name: "per-user", RequestsPerUnit: 100, Unit: rlspb.RateLimitResponse_RateLimit_SECOND},
			LimitRemaining:     99,
			DurationUntilReset: durationpb.New(time.Second),
		}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{
			{Key: "Ratelimit-Policy", Value: `"per-user";q=100;w=1`},
			{Key: "Ratelimit", Value: `"per-user";r=99;t=1`},
			{Key: "Ratelimit-Limit", Value: "100"},
			{Key: "Ratelimit-Remaining", Value: "99"},
			{Key: "Ratelimit-Reset", Value: "1"},
		},
	}
	for _, c := range []encoding.CodecV2{newCodec().proto, newCodec()} {
		name := "proto"
		if _, ok := c.(codec); ok {
			name = "codec"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				data, err := c.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
			}
		})
	}
}

// TestAttackEmptyDescriptorsAmplifyDecoding: an empty descriptor or
// entry is two bytes on the wire and some eighty decoded, so a call of
// max_recv_bytes made of them made the server allocate some forty times
// its size before validate refused it for its count: max_in_flight such
// calls at once could have it allocate GiBs, where the bounds promise
// max_in_flight x max_recv_bytes. A call with more descriptors, or a
// descriptor with more entries, than a call may have is refused before
// it is decoded, by either decoder (a limit override sends it to
// proto.Unmarshal).
func TestAttackEmptyDescriptorsAmplifyDecoding(t *testing.T) {
	domain := []byte{0x0a, 0x01, 'd'}
	empty := bytes.Repeat([]byte{0x12, 0x00}, 120_000)
	entries := bytes.Repeat([]byte{0x0a, 0x00}, 120_000)
	many := append(append(append([]byte{}, domain...), 0x12), protowire.AppendVarint(nil, uint64(len(entries)))...)
	for name, b := range map[string][]byte{
		"descriptors":                 append(append([]byte{}, domain...), empty...),
		"entries":                     append(many, entries...),
		"descriptors after overrides": append(append(append([]byte{}, domain...), 0x12, 0x02, 0x12, 0x00), empty...),
	} {
		var req rlspb.RateLimitRequest
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &req)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; err == nil || n > uint64(len(b)) {
			t.Errorf("%s: a %d-byte call allocated %d bytes to decode (error %v), want it refused before decoding", name, len(b), n, err)
		}
	}
}
