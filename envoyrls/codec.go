package envoyrls

import (
	"fmt"
	"sync"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// vtMarshaler is a message with the marshalling code that vtprotobuf
// generates: go-control-plane ships it for its messages (the responses
// sluice sends among them), compiled in with the build tag vtprotobuf.
// It walks the message's fields directly instead of through protobuf's
// tables, in less time (BenchmarkCodecMarshal compares the two).
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict(dAtA []byte) (int, error)
}

// vtCompiled reports whether go-control-plane's generated marshalling is
// in this binary (go build -tags vtprotobuf).
var vtCompiled = func() bool {
	_, ok := any(&rlspb.RateLimitResponse{}).(vtMarshaler)
	return ok
}()

// codec is grpc-go's proto codec, except that it marshals a message that
// has generated vtprotobuf code with that code, and decodes a
// RateLimitRequest of the usual shape itself (decodeRequest).
// Everything else (the health and reflection services' messages, any
// other request: go-control-plane generates no unmarshalling code) goes
// to the proto codec. The bytes are those proto.Marshal writes, but for a message with
// a oneof set (a Quota, which sluice never sends): the generated code
// writes it in field-number order, proto where the Go struct declares it.
//
// It is applied with grpc.ForceServerCodecV2 (ServerOptions) rather than
// registered, because registering a codec under the name "proto" replaces
// grpc-go's for every client and server of the process, a program that
// imports this package included.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2(grpcproto.Name)} }

// Marshal does what the proto codec does, with the generated code, in a
// buffer that grpc-go gives back to its pool once it is written: from
// mem.DefaultBufferPool for a large message, from smallBuffers for one
// below grpc-go's pooling threshold (every response of one descriptor),
// which the proto codec would allocate, with its wrapping, per call.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*recycled); ok {
		// Once marshalled, nothing reads it (handleShouldRateLimit).
		b, err := c.Marshal(r.RateLimitResponse)
		r.release()
		return b, err
	}
	m, ok := v.(vtMarshaler)
	if !ok {
		return c.proto.Marshal(v)
	}
	size := m.SizeVT()
	var pool mem.BufferPool = mem.DefaultBufferPool()
	if size <= smallBufferCap && mem.IsBelowBufferPoolingThreshold(size) {
		pool = smallBuffers
	}
	buf := pool.Get(size)
	n, err := m.MarshalToSizedBufferVTStrict((*buf)[:size])
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	if n != size {
		// The generated code fills the buffer from its end: a size that
		// overstated the message would leave a gap at the start.
		copy(*buf, (*buf)[size-n:size])
		*buf = (*buf)[:n]
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal is the proto codec's, except that a RateLimitRequest of the
// usual shape is decoded by decodeRequest, and a crowded one refused.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*rlspb.RateLimitRequest)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	proto.Reset(req)
	if crowded(b, 2, maxDescriptors) {
		return fmt.Errorf("more than %d descriptors, or a descriptor of more than %d entries", maxDescriptors, maxEntries)
	}
	if decodeRequest(b, req) {
		return nil
	}
	return proto.Unmarshal(b, req)
}

// Name is the proto codec's: the bytes on the wire are the same.
func (codec) Name() string { return grpcproto.Name }

// smallBufferCap is the capacity of smallBuffers' buffers: above
// grpc-go's pooling threshold, so that mem.NewBuffer pools them rather
// than treating them as slices of their own, and large enough for a
// response of a few descriptors with their headers.
const smallBufferCap = 2 << 10

// smallBuffers is the pool of the buffers of messages below grpc-go's
// pooling threshold.
var smallBuffers = &smallBufferPool{p: sync.Pool{New: func() any {
	b := make([]byte, 0, smallBufferCap)
	return &b
}}}

// smallBufferPool is a mem.BufferPool of buffers of smallBufferCap.
type smallBufferPool struct{ p sync.Pool }

// Get returns a buffer of length n, which must be at most
// smallBufferCap.
func (sp *smallBufferPool) Get(n int) *[]byte {
	b := sp.p.Get().(*[]byte)
	*b = (*b)[:n]
	return b
}

// Put takes back a buffer that Get returned; any other is left to the
// collector.
func (sp *smallBufferPool) Put(b *[]byte) {
	if cap(*b) == smallBufferCap {
		sp.p.Put(b)
	}
}
