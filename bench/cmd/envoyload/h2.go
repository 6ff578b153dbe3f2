package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
)

// The h2 client speaks gRPC over HTTP/2 framed by hand: each connection
// is one goroutine that reads the server's frames and, as each call is
// answered, starts the next on a new stream, writing what it has to send
// when it has read everything the server sent. Every request is encoded
// once beforehand. Where grpc-go's client spends a goroutine, a context
// and several wake-ups per call, this one spends a few frames, so on a
// core shared with Redis it leaves the server's core the bound, as a C
// client such as h2load does; unlike h2load, its calls draw their
// descriptor value from the Zipf skew as the grpc client's do.

// shouldRateLimitPath is the method's HTTP/2 path.
const shouldRateLimitPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// recvWindow is the receive window the client grants the server, for the
// connection and each stream; the connection's is topped up whenever
// half of it has been used.
const recvWindow = 1 << 30

// h2Driver returns a driver over conns connections to addr, its callers
// spread over them as streams in flight.
func h2Driver(addr string, conns int, keys []string, skew float64, timeout time.Duration) (driver, error) {
	bodies := make([][]byte, len(keys))
	for i, k := range keys {
		var err error
		if bodies[i], err = grpcMessage(request(k)); err != nil {
			return nil, err
		}
	}
	fields := []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: shouldRateLimitPath},
		{Name: ":authority", Value: addr},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
	}
	if timeout > 0 {
		v := strconv.FormatInt(timeout.Microseconds(), 10) + "u"
		if len(v) > 9 { // grpc-timeout has at most 8 digits
			v = strconv.FormatInt(timeout.Milliseconds(), 10) + "m"
		}
		fields = append(fields, hpack.HeaderField{Name: "grpc-timeout", Value: v})
	}
	return func(l *load, callers int) func() [][]time.Duration {
		lat := make([][]time.Duration, conns)
		var open []net.Conn
		var wg sync.WaitGroup
		for c := range conns {
			streams := callers / conns
			if c < callers%conns {
				streams++
			}
			if streams == 0 {
				continue
			}
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				fmt.Printf("envoyload: connection %d: %v\n", c, err)
				continue
			}
			open = append(open, conn)
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(c), 42))
				h := &h2Conn{l: l, bodies: bodies, zipf: rand.NewZipf(rng, skew, 1, uint64(len(keys)-1)), lat: make([]time.Duration, 0, 1<<18)}
				if err := h.drive(conn, fields, streams); err != nil && !l.stop.Load() {
					fmt.Printf("envoyload: connection %d: %v\n", c, err)
				}
				lat[c] = h.lat
			}()
		}
		// Once stopped, a connection's reader may wait for answers that
		// never come (a server that stopped answering): closing it ends
		// the wait.
		return func() [][]time.Duration {
			for _, conn := range open {
				conn.Close()
			}
			wg.Wait()
			return lat
		}
	}, nil
}

// h2Conn is one connection's calls.
type h2Conn struct {
	l      *load
	bodies [][]byte
	zipf   *rand.Zipf
	lat    []time.Duration

	fr         *http2.Framer
	headers    [2][]byte // the first call's HPACK block, and every later one's
	nextID     uint32
	started    map[uint32]time.Time
	sendWindow int64 // the connection's, for DATA
	queued     int   // calls waiting for sendWindow
	unacked    int   // bytes received since the last WINDOW_UPDATE
	maxStreams int
	maxBody    int // the longest request body
}

// drive runs streams calls in flight on conn until l.stop.
func (h *h2Conn) drive(conn net.Conn, fields []hpack.HeaderField, streams int) error {
	bw := bufio.NewWriterSize(conn, 64<<10)
	br := bufio.NewReaderSize(conn, 64<<10)
	if _, err := bw.WriteString(http2.ClientPreface); err != nil {
		return err
	}
	h.fr = http2.NewFramer(bw, br)
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	h.fr.SetReuseFrames()
	// The same fields encoded twice by one encoder: the second block
	// refers to the dynamic table the first one filled, as a client's
	// later calls do.
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for i := range h.headers {
		buf.Reset()
		for _, f := range fields {
			if err := enc.WriteField(f); err != nil {
				return err
			}
		}
		h.headers[i] = bytes.Clone(buf.Bytes())
	}
	if err := h.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: recvWindow}); err != nil {
		return err
	}
	if err := h.fr.WriteWindowUpdate(0, recvWindow-65535); err != nil {
		return err
	}
	h.nextID, h.started, h.sendWindow, h.maxStreams = 1, make(map[uint32]time.Time, streams), 65535, streams
	for _, b := range h.bodies {
		h.maxBody = max(h.maxBody, len(b))
	}
	for range streams {
		if err := h.call(); err != nil {
			return err
		}
	}
	for !h.l.stop.Load() {
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return err
			}
		}
		f, err := h.fr.ReadFrame()
		if err != nil {
			return err
		}
		if err := h.frame(f); err != nil {
			return err
		}
	}
	return nil
}

// call starts a call on a new stream, or queues it while the streams in
// flight are at the server's limit or the connection's send window is
// too small for a body.
func (h *h2Conn) call() error {
	h.queued++
	return h.dequeue()
}

// dequeue starts the calls queued while the server's limits allow.
func (h *h2Conn) dequeue() error {
	for ; h.queued > 0 && len(h.started) < h.maxStreams && h.sendWindow >= int64(h.maxBody); h.queued-- {
		body := h.bodies[h.zipf.Uint64()]
		id := h.nextID
		h.nextID += 2
		hb := h.headers[1]
		if id == 1 {
			hb = h.headers[0]
		}
		if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb, EndHeaders: true}); err != nil {
			return err
		}
		if err := h.fr.WriteData(id, true, body); err != nil {
			return err
		}
		h.sendWindow -= int64(len(body))
		h.started[id] = time.Now()
	}
	return nil
}

// frame handles one frame from the server.
func (h *h2Conn) frame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok && int(v) < h.maxStreams {
			h.maxStreams = int(v)
		}
		return h.fr.WriteSettingsAck()
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		return h.fr.WritePing(true, f.Data)
	case *http2.WindowUpdateFrame:
		if f.StreamID != 0 {
			return nil
		}
		h.sendWindow += int64(f.Increment)
		return h.dequeue()
	case *http2.DataFrame:
		if h.unacked += int(f.Length); h.unacked > recvWindow/2 {
			if err := h.fr.WriteWindowUpdate(0, uint32(h.unacked)); err != nil {
				return err
			}
			h.unacked = 0
		}
		if over, ok := overLimit(f.Data()); ok && over && h.l.measuring.Load() {
			h.l.over.Add(1)
		}
		if f.StreamEnded() { // no trailers: not a gRPC answer
			return h.done(f.StreamID, false)
		}
	case *http2.MetaHeadersFrame:
		if f.StreamEnded() {
			return h.done(f.StreamID, grpcOK(f))
		}
		if f.PseudoValue("status") != "200" {
			return h.done(f.StreamID, false)
		}
	case *http2.RSTStreamFrame:
		return h.done(f.StreamID, false)
	case *http2.GoAwayFrame:
		return fmt.Errorf("the server went away: %v", f.ErrCode)
	}
	return nil
}

// done ends the call on stream id, answered well or not, and starts the
// next one.
func (h *h2Conn) done(id uint32, ok bool) error {
	t, found := h.started[id]
	if !found {
		return nil
	}
	delete(h.started, id)
	if h.l.measuring.Load() {
		h.lat = append(h.lat, time.Since(t))
		h.l.calls.Add(1)
		if !ok {
			h.l.errs.Add(1)
		}
	}
	if h.l.stop.Load() {
		return nil
	}
	return h.call()
}

// grpcOK says whether trailers f end a call with grpc-status 0.
func grpcOK(f *http2.MetaHeadersFrame) bool {
	for _, hf := range f.RegularFields() {
		if hf.Name == "grpc-status" {
			return hf.Value == "0"
		}
	}
	return false
}

// overLimit reads a RateLimitResponse's overall_code from a DATA frame
// that holds one whole gRPC message, as the server's answers do.
func overLimit(b []byte) (over, ok bool) {
	if len(b) < 5 || b[0] != 0 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
		return false, false
	}
	b = b[5:]
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false, false
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			return n > 0 && v == uint64(rlspb.RateLimitResponse_OVER_LIMIT), n > 0
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return false, false
		}
		b = b[n:]
	}
	return false, true // overall_code 0 (UNKNOWN) is not written
}
