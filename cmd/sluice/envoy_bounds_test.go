package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// serveEnvoy runs sluice serve with the Envoy service on loopback, extra
// prepended to envoyRule, and returns the decision API's address and the
// gRPC service's.
func serveEnvoy(t *testing.T, extra string) (api, grpcAddress string) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "envoy.yaml")
	body := "listen: \"127.0.0.1:0\"\ngrpc_listen: \"127.0.0.1:0\"\n" + extra + envoyRule
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	l, logs := startServeArgs(t, "--config", cfg)
	return l.API, grpcAddr(t, logs)
}

// envoyCall is a ShouldRateLimit call of n descriptors for envoyRule, each
// a client entry and entries-1 more of size-byte values.
func envoyCall(n, entries, size int) *rlspb.RateLimitRequest {
	req := &rlspb.RateLimitRequest{Domain: "edge"}
	v := strings.Repeat("v", size)
	for i := range n {
		d := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: "c" + strconv.Itoa(i)}}}
		for j := 1; j < entries; j++ {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: "k" + strconv.Itoa(j), Value: v})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// preEncoded is a message marshalled once, sent as it is by encodedCodec:
// the test's clients then hold one copy of the flood's call rather than
// one per call in flight, so that the heap measured is the server's.
type preEncoded []byte

// encodedCodec sends a preEncoded message's bytes and reads answers as
// grpc-go's proto codec does.
type encodedCodec struct{ encoding.CodecV2 }

func (c encodedCodec) Marshal(v any) (mem.BufferSlice, error) {
	if p, ok := v.(preEncoded); ok {
		return mem.BufferSlice{mem.SliceBuffer(p)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// liveHeap is the heap in use after a collection: what the process holds.
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Attack: 400 concurrent ShouldRateLimit calls of 64 descriptors x 16
// entries x 2,000-byte values (about 2 MiB each) grew sluice serve's
// memory without bound, and /healthz slowed with it
// (bench/results/2026-11-27.md has the figures). Such a call is now
// refused before it is read (ResourceExhausted), and a flood of 400
// concurrent calls of the largest size accepted, over four connections,
// keeps the process's heap (this test's clients, which hold one copy of
// the call, included) under 512 MiB
// while /healthz answers throughout. The bound, not a time, is asserted.
func TestAttackGRPCFloodStaysBounded(t *testing.T) {
	api, addr := serveEnvoy(t, "")
	var ccs []*grpc.ClientConn
	for range 4 {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ccs = append(ccs, cc)
	}
	huge := envoyCall(64, 16, 2000)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := rlspb.NewRateLimitServiceClient(ccs[0]).ShouldRateLimit(ctx, huge); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a %d-byte call: %v, want ResourceExhausted", proto.Size(huge), err)
	}

	// The largest call the defaults accept: just under 256 KiB.
	fits := envoyCall(64, 2, 3900)
	if n := proto.Size(fits); n > 256<<10 || n < 240<<10 {
		t.Fatalf("the flood's call is %d bytes", n)
	}
	wire, err := proto.Marshal(fits)
	if err != nil {
		t.Fatal(err)
	}
	codec := grpc.ForceCodecV2(encodedCodec{encoding.GetCodecV2(protoenc.Name)})
	const perConn = 100
	var answered, refused atomic.Int64
	var wg sync.WaitGroup
	for _, cc := range ccs {
		for range perConn {
			wg.Go(func() {
				err := cc.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", preEncoded(wire), new(rlspb.RateLimitResponse), codec)
				switch status.Code(err) {
				case codes.OK:
					answered.Add(1)
				case codes.ResourceExhausted: // past max_in_flight
					refused.Add(1)
				default:
					t.Errorf("a call of the flood: %v", err)
				}
			})
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	hc := &http.Client{Timeout: 30 * time.Second}
	var peak uint64
	for flooding := true; flooding; {
		select {
		case <-done:
			flooding = false
		default:
		}
		peak = max(peak, liveHeap())
		resp, err := hc.Get("http://" + api + "/healthz")
		if err != nil {
			t.Fatalf("/healthz during the flood: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthz during the flood: %s", resp.Status)
		}
	}
	t.Logf("%d answered, %d refused; live heap at most %d MiB", answered.Load(), refused.Load(), peak>>20)
	if answered.Load() == 0 {
		t.Errorf("no call of the flood was answered")
	}
	if peak > 512<<20 {
		t.Errorf("the live heap reached %d MiB under the flood, want at most 512 MiB", peak>>20)
	}
}

// TestGRPCFloodFigures measures the flood of bench/README.md#a-flood-of-large-grpc-calls when
// SLUICE_GRPC_FLOOD is "ENTRIES,SIZE": 400 concurrent calls of 64
// descriptors of ENTRIES entries of SIZE-byte values over 4 connections,
// logging the answers, the largest live heap and peak resident memory of
// the process, and the slowest /healthz seen meanwhile. It asserts
// nothing, and runs only when asked.
func TestGRPCFloodFigures(t *testing.T) {
	entries, size, ok := strings.Cut(os.Getenv("SLUICE_GRPC_FLOOD"), ",")
	ne, err1 := strconv.Atoi(entries)
	ns, err2 := strconv.Atoi(size)
	if !ok || err1 != nil || err2 != nil {
		t.Skip(`SLUICE_GRPC_FLOOD="ENTRIES,SIZE" (such as "16,2000") runs it`)
	}
	api, addr := serveEnvoy(t, "")
	wire, err := proto.Marshal(envoyCall(64, ne, ns))
	if err != nil {
		t.Fatal(err)
	}
	codec := grpc.ForceCodecV2(encodedCodec{encoding.GetCodecV2(protoenc.Name)})
	var ccs []*grpc.ClientConn
	for range 4 {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ccs = append(ccs, cc)
	}
	var mu sync.Mutex
	answers := map[codes.Code]int{}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 400 {
		wg.Go(func() {
			err := ccs[i%4].Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", preEncoded(wire), new(rlspb.RateLimitResponse), codec)
			mu.Lock()
			answers[status.Code(err)]++
			mu.Unlock()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var peak uint64
	var slowest time.Duration
	for flooding := true; flooding; {
		select {
		case <-done:
			flooding = false
		default:
		}
		peak = max(peak, liveHeap())
		t0 := time.Now()
		if resp, err := http.Get("http://" + api + "/healthz"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		slowest = max(slowest, time.Since(t0))
	}
	proc, _ := os.ReadFile("/proc/self/status")
	_, hwm, _ := strings.Cut(string(proc), "VmHWM:")
	hwm, _, _ = strings.Cut(hwm, "\n")
	t.Logf("%d-byte calls: %v in %v; live heap at most %d MiB; peak resident %s; slowest /healthz %v",
		len(wire), answers, time.Since(start).Round(time.Millisecond), peak>>20, strings.TrimSpace(hwm), slowest.Round(time.Millisecond))
}

// h2 is a bare HTTP/2 connection to the gRPC listener: a client that
// ignores what the server asks of it, as an attacker's would.
type h2 struct {
	net.Conn
	r *bufio.Reader
}

const (
	frameHeaders  = 0x1
	frameRST      = 0x3
	frameSettings = 0x4
	framePing     = 0x6
	flagAck       = 0x1
	flagEndHeads  = 0x4

	settingMaxStreams = 0x3
	errRefusedStream  = 0x7
)

// dialH2 connects and sends the client preface and an empty SETTINGS.
func dialH2(t *testing.T, addr string) *h2 {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &h2{Conn: c, r: bufio.NewReader(c)}
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	h.write(t, frameSettings, 0, 0, nil)
	return h
}

func (h *h2) write(t *testing.T, typ, flags byte, stream uint32, payload []byte) {
	t.Helper()
	b := make([]byte, 9, 9+len(payload))
	b[0], b[1], b[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	b[3], b[4] = typ, flags
	binary.BigEndian.PutUint32(b[5:], stream)
	if _, err := h.Write(append(b, payload...)); err != nil {
		t.Fatal(err)
	}
}

func (h *h2) read() (typ, flags byte, stream uint32, payload []byte, err error) {
	var hdr [9]byte
	if _, err = io.ReadFull(h.r, hdr[:]); err != nil {
		return
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	payload = make([]byte, n)
	_, err = io.ReadFull(h.r, payload)
	return hdr[3], hdr[4], binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff, payload, err
}

// serverSettings reads up to the server's SETTINGS frame, acknowledges
// it, and returns its values.
func (h *h2) serverSettings(t *testing.T) map[uint16]uint32 {
	t.Helper()
	for {
		typ, flags, _, p, err := h.read()
		if err != nil {
			t.Fatalf("reading the server's SETTINGS: %v", err)
		}
		if typ != frameSettings || flags&flagAck != 0 {
			continue
		}
		h.write(t, frameSettings, flagAck, 0, nil)
		out := map[uint16]uint32{}
		for ; len(p) >= 6; p = p[6:] {
			out[binary.BigEndian.Uint16(p)] = binary.BigEndian.Uint32(p[2:])
		}
		return out
	}
}

// hpackLiteral encodes headers as HPACK literals without indexing, for
// names and values shorter than 127 bytes.
func hpackLiteral(kv ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		b = append(b, 0, byte(len(kv[i])))
		b = append(b, kv[i]...)
		b = append(b, byte(len(kv[i+1])))
		b = append(b, kv[i+1]...)
	}
	return b
}

// Attack: one connection opened as many concurrent calls as it liked (no
// MAX_CONCURRENT_STREAMS), each holding a goroutine and its message. The
// server now announces 100 streams per connection, and a client that
// opens a 101st regardless has it refused (RST_STREAM REFUSED_STREAM).
func TestAttackGRPCStreamsPerConnectionCapped(t *testing.T) {
	_, addr := serveEnvoy(t, "")
	h := dialH2(t, addr)
	h.SetDeadline(time.Now().Add(time.Minute)) // a hang guard only
	if got, ok := h.serverSettings(t)[settingMaxStreams]; !ok || got != 100 {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS: %d (announced: %v), want 100", got, ok)
	}
	block := hpackLiteral(":method", "POST", ":scheme", "http", ":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
		":authority", "sluice", "content-type", "application/grpc", "te", "trailers")
	const opened = 101
	for i := range opened {
		// Headers without a body: each call stays open, waiting for its
		// message.
		h.write(t, frameHeaders, flagEndHeads, uint32(2*i+1), block)
	}
	// The server reads frames in order: its answer to every HEADERS is
	// queued before the acknowledgement of this PING.
	h.write(t, framePing, 0, 0, []byte("boundsok"))
	refused := map[uint32]bool{}
	for {
		typ, flags, stream, p, err := h.read()
		if err != nil {
			t.Fatalf("waiting for the PING's acknowledgement: %v", err)
		}
		if typ == frameRST && len(p) == 4 && binary.BigEndian.Uint32(p) == errRefusedStream {
			refused[stream] = true
		}
		if typ == framePing && flags&flagAck != 0 {
			break
		}
	}
	if len(refused) != 1 || !refused[2*(opened-1)+1] {
		t.Errorf("streams refused: %v; want only the 101st (stream %d)", refused, 2*(opened-1)+1)
	}
}

// Attack: nothing capped the gRPC listener's connections, so a client
// could open them until the process ran out of file descriptors. With
// the grpc section's max_conns, a connection past the cap waits (not
// served: no SETTINGS) until one closes, and is served then.
func TestAttackGRPCConnectionsCapped(t *testing.T) {
	_, addr := serveEnvoy(t, "grpc: {max_conns: 2}\n")
	first := dialH2(t, addr)
	for _, h := range []*h2{first, dialH2(t, addr)} {
		h.SetDeadline(time.Now().Add(time.Minute))
		h.serverSettings(t)
	}
	third := dialH2(t, addr)
	// A short wait can only miss a server that answers late, which would
	// let this check pass, never fail one that holds the connection back.
	third.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if typ, _, _, _, err := third.read(); err == nil {
		t.Fatalf("a third connection past max_conns 2 was served (frame type %d)", typ)
	} else if ne := (net.Error)(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("the third connection: %v, want it held without an answer", err)
	}
	first.Close()
	third.SetDeadline(time.Now().Add(time.Minute))
	third.serverSettings(t)
}
