package envoyrls_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/serverconf"
)

// bigCall is a call of n descriptors of entries entries, each value of
// size bytes: the attack's 64 x 16 x 2,000 bytes is about 2 MiB.
func bigCall(n, entries, size int) *rlspb.RateLimitRequest {
	req := &rlspb.RateLimitRequest{Domain: "edge"}
	v := strings.Repeat("v", size)
	for i := range n {
		d := desc("client", "c"+strconv.Itoa(i))
		for j := 1; j < entries; j++ {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: "k" + strconv.Itoa(j), Value: v})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// Attack: a call of 64 descriptors x 16 entries x 2,000-byte values
// (about 2 MiB, within every per-part bound) was decoded and decided:
// 400 of them at once took the process past 2 GB. A message over the
// receive size (max_recv_bytes, 256 KiB) is refused before it is read,
// and on a server without that option the descriptors' bytes together are
// still bounded; a call that fits is answered.
func TestAttackGRPCOversizedCallRefused(t *testing.T) {
	pol, err := policy.Parse("sluice.yaml", []byte(sluiceYAML))
	if err != nil {
		t.Fatal(err)
	}
	big := bigCall(64, 16, 2000)
	bounded := startWith(t, pol, memory.New(memory.Options{}), nil, append(envoyrls.ServerOptions(), envoyrls.LimitOptions(serverconf.GRPCLimits{}, serverconf.ServerLimits{})...)...)
	if _, err := bounded.rls.ShouldRateLimit(context.Background(), big, grpc.MaxCallSendMsgSize(8<<20)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a %d-byte call: %v, want ResourceExhausted", proto.Size(big), err)
	}
	plain := startWith(t, pol, memory.New(memory.Options{}), nil, envoyrls.ServerOptions()...)
	if _, err := plain.rls.ShouldRateLimit(context.Background(), big); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "max_recv_bytes") {
		t.Fatalf("a %d-byte call on a server without LimitOptions: %v, want InvalidArgument naming max_recv_bytes", proto.Size(big), err)
	}
	fits := bigCall(64, 2, 1900)
	if n := proto.Size(fits); n > serverconf.DefaultGRPCLimits.MaxRecvBytes {
		t.Fatalf("the call that should fit is %d bytes", n)
	}
	for _, h := range []*harness{bounded, plain} {
		if _, err := h.rls.ShouldRateLimit(context.Background(), fits); err != nil {
			t.Fatalf("a call within the bounds: %v", err)
		}
	}
}

// heldStore holds every store call until release is closed, so that the
// calls a server admits stay in flight while a test counts them.
type heldStore struct {
	sluice.Store
	held    atomic.Int64
	release chan struct{}
}

func (s *heldStore) wait(ctx context.Context) {
	s.held.Add(1)
	select {
	case <-s.release:
	case <-ctx.Done():
	}
}

func (s *heldStore) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	s.wait(ctx)
	return s.Store.Take(ctx, op, r)
}

func (s *heldStore) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, _ []sluice.Decision) ([]sluice.Decision, error) {
	s.wait(ctx)
	return s.Store.TakeAll(ctx, op, rs, nil)
}

// Attack: calls held open by a slow store (or sent faster than they are
// decided) pile up without bound, each holding its message: one
// connection carried any number of them. At most max_in_flight calls of
// the whole server are decided at once; the next is refused at once with
// ResourceExhausted before its message is read, health checks are still
// answered, and every place comes back when its call ends, answered or
// cancelled.
func TestAttackGRPCInFlightBounded(t *testing.T) {
	pol, err := policy.Parse("sluice.yaml", []byte(sluiceYAML))
	if err != nil {
		t.Fatal(err)
	}
	const maxInFlight, perConn, conns = 8, 10, 2
	st := &heldStore{Store: memory.New(memory.Options{}), release: make(chan struct{})}
	h := startWith(t, pol, st, nil, append(envoyrls.ServerOptions(), envoyrls.LimitOptions(serverconf.GRPCLimits{MaxInFlight: maxInFlight}, serverconf.ServerLimits{})...)...)
	clients := []rlspb.RateLimitServiceClient{h.rls}
	for range conns - 1 {
		cc, err := grpc.NewClient(h.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		clients = append(clients, rlspb.NewRateLimitServiceClient(cc))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var refused, answered atomic.Int64
	var wg sync.WaitGroup
	for i, c := range clients {
		for j := range perConn {
			wg.Go(func() {
				_, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("client", "c"+strconv.Itoa(i*perConn+j))}})
				switch status.Code(err) {
				case codes.ResourceExhausted:
					refused.Add(1)
				case codes.OK:
					answered.Add(1)
				default:
					t.Errorf("call: %v", err)
				}
			})
		}
	}
	// Every call is either held in the store or refused; the loop's bound
	// only stops a broken server from hanging the test.
	for deadline := time.Now().Add(30 * time.Second); st.held.Load()+refused.Load() < conns*perConn; {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: %d calls held, %d refused, of %d", st.held.Load(), refused.Load(), conns*perConn)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := st.held.Load(); got != maxInFlight {
		t.Errorf("%d calls in flight at once, want max_in_flight %d", got, maxInFlight)
	}
	hc, err := healthpb.NewHealthClient(h.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: envoyrls.ServiceName})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health check while every place is taken: %v, %v", hc, err)
	}
	close(st.release)
	wg.Wait()
	if a, r := answered.Load(), refused.Load(); a != maxInFlight || r != conns*perConn-maxInFlight {
		t.Errorf("%d answered, %d refused; want %d and %d", a, r, maxInFlight, conns*perConn-maxInFlight)
	}

	// The places came back: a second round, cancelled while held, then a
	// third that finds every place free again.
	st2 := &heldStore{Store: memory.New(memory.Options{}), release: make(chan struct{})}
	h2 := startWith(t, pol, st2, nil, append(envoyrls.ServerOptions(), envoyrls.LimitOptions(serverconf.GRPCLimits{MaxInFlight: maxInFlight}, serverconf.ServerLimits{})...)...)
	cctx, ccancel := context.WithCancel(context.Background())
	var wg2 sync.WaitGroup
	for i := range maxInFlight {
		wg2.Go(func() {
			h2.rls.ShouldRateLimit(cctx, &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("client", "x"+strconv.Itoa(i))}})
		})
	}
	for deadline := time.Now().Add(30 * time.Second); st2.held.Load() < maxInFlight; {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: %d calls held, want %d", st2.held.Load(), maxInFlight)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ccancel()
	wg2.Wait()
	close(st2.release)
	// A cancelled call's place is given back when grpc-go ends its
	// stream, a moment after the client's cancel: wait for all of them.
	for deadline := time.Now().Add(30 * time.Second); ; {
		var wg3 sync.WaitGroup
		var fails atomic.Int64
		for i := range maxInFlight {
			wg3.Go(func() {
				if _, err := h2.rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("client", "y"+strconv.Itoa(i))}}); err != nil {
					fails.Add(1)
				}
			})
		}
		wg3.Wait()
		if fails.Load() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the cancelled calls, %d of %d calls are still refused", fails.Load(), maxInFlight)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Attack: a call takes a place when its headers arrive, before grpc-go
// knows whether any handler will run it. Calls that never reach the
// Envoy handler (an unknown method here; an encoding the server cannot
// read, or a stream reset before its turn, go the same way) would keep
// their places for good if only the handler gave them back, and
// max_in_flight of them would leave the server refusing every call. Their
// places come back once their streams have ended.
func TestAttackGRPCUnhandledCallsGiveBackTheirPlaces(t *testing.T) {
	pol, err := policy.Parse("sluice.yaml", []byte(sluiceYAML))
	if err != nil {
		t.Fatal(err)
	}
	const maxInFlight = 4
	h := startWith(t, pol, memory.New(memory.Options{}), nil, append(envoyrls.ServerOptions(), envoyrls.LimitOptions(serverconf.GRPCLimits{MaxInFlight: maxInFlight}, serverconf.ServerLimits{})...)...)
	ctx := context.Background()
	for range 3 * maxInFlight {
		err := h.conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod", &rlspb.RateLimitRequest{Domain: "edge"}, new(rlspb.RateLimitResponse))
		if c := status.Code(err); c != codes.Unimplemented && c != codes.ResourceExhausted {
			t.Fatalf("a call of an unknown method: %v, want Unimplemented (or ResourceExhausted)", err)
		}
	}
	// The unknown calls' places come back when a call finds none free (at
	// most once a millisecond): retried until then, bounded only so that
	// a server that lost them fails instead of hanging.
	call := &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("client", "after")}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		var wg sync.WaitGroup
		var fails atomic.Int64
		for range maxInFlight {
			wg.Go(func() {
				if _, err := h.rls.ShouldRateLimit(ctx, call); err != nil {
					fails.Add(1)
				}
			})
		}
		wg.Wait()
		if fails.Load() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d calls of an unknown method, %d of %d calls are still refused", 3*maxInFlight, fails.Load(), maxInFlight)
		}
	}
}

// The server holds every connection to fixed flow-control windows: it
// announces HTTP/2's initial window and, carrying calls, sends no ping of
// its own. grpc-go's bandwidth estimate would ping the client after each
// call's data, for as long as the calls come, and grow a stream's window
// up to 16 MiB for a client that fills it.
func TestFixedFlowControlWindows(t *testing.T) {
	pol, err := policy.Parse("sluice.yaml", []byte(sluiceYAML))
	if err != nil {
		t.Fatal(err)
	}
	h := startWith(t, pol, memory.New(memory.Options{}), nil, append(envoyrls.ServerOptions(), envoyrls.LimitOptions(serverconf.GRPCLimits{}, serverconf.ServerLimits{})...)...)
	c, err := net.Dial("tcp", h.conn.Target())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	msg, err := proto.Marshal(&rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("client", "c1")}})
	if err != nil {
		t.Fatal(err)
	}
	body := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	body = append(body, msg...)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	const calls = 8
	for i := range calls {
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}, {":authority", "rls"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		id := uint32(2*i + 1)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
		fr.WriteData(id, true, body)
	}
	ours := [8]byte{'s', 'l', 'u', 'i', 'c', 'e'}
	var window uint32 = 65535
	ended, serverPings := 0, 0
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %d of %d answers: %v", ended, calls, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				window = v
			}
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if f.IsAck() && f.Data == ours {
				if serverPings != 0 {
					t.Errorf("the server sent %d pings of its own while carrying %d calls, want none", serverPings, calls)
				}
				if window != 65535 {
					t.Errorf("the server announced a stream window of %d, want 65535", window)
				}
				return
			}
			if !f.IsAck() {
				serverPings++
				fr.WritePing(true, f.Data)
			}
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				// Once every call is answered, a ping of the client's own:
				// its ack comes after any frame the server queued before.
				if ended++; ended == calls {
					fr.WritePing(false, ours)
				}
			}
		}
	}
}
