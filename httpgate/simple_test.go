package httpgate_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
)

// manualLimiter is a limiter over a fresh memory store on a manual clock.
func manualLimiter() (*sluice.Limiter, *sluice.ManualClock) {
	clk := sluice.NewManualClock(sluiceEpoch)
	return sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk}), clk
}

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })

// recordFrom sends one request from peer to h, with extra headers as name,
// value pairs, and returns the recorded response.
func recordFrom(h http.Handler, peer string, hdr ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", "/orders", nil)
	req.RemoteAddr = peer
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// dump is a response as a client sees it: status, headers, body.
func dump(w *httptest.ResponseRecorder) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n", w.Code)
	w.Header().Write(&b)
	b.WriteString(w.Body.String())
	return b.String()
}

// A limit built in code answers exactly as the same limit written in a
// file: the same RateLimit fields, 429, Retry-After and problem+json.
func TestLimitByIPAnswersAsTheFile(t *testing.T) {
	codeLim, codeClk := manualLimiter()
	fileLim, fileClk := manualLimiter()
	code := httpgate.LimitByIP(2, time.Minute, httpgate.WithLimiter(codeLim))(hello)
	file := httpgate.Middleware(mustPolicy(t, `rules:
  - name: ip-2-per-1m
    limit_keys: ["ip:address"]
    algorithm_config: {rate: 2, period: 1m, capacity: 2}
`), fileLim, httpgate.Options{})(hello)
	for i := range 4 {
		c, f := recordFrom(code, "192.0.2.7:1234"), recordFrom(file, "192.0.2.7:1234")
		if dump(c) != dump(f) {
			t.Fatalf("request %d:\ncode:\n%s\nfile:\n%s", i, dump(c), dump(f))
		}
		if want := []int{200, 200, 429, 200}[i]; c.Code != want {
			t.Fatalf("request %d: %d, want %d\n%s", i, c.Code, want, dump(c))
		}
		if i == 2 {
			if c.Header().Get("Retry-After") == "" || !strings.Contains(c.Body.String(), `"ip-2-per-1m"`) ||
				c.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("a rejection without Retry-After or the limit's name:\n%s", dump(c))
			}
			// A token comes back every 30 s.
			codeClk.Advance(30 * time.Second)
			fileClk.Advance(30 * time.Second)
		}
	}
}

// Each client address has its own bucket; IPv6 clients are counted by
// /64, as ip:address in a file counts them.
func TestLimitByIPPerClient(t *testing.T) {
	lim, _ := manualLimiter()
	h := httpgate.LimitByIP(1, time.Hour, httpgate.WithLimiter(lim))(hello)
	for _, peer := range []string{"192.0.2.1:1", "192.0.2.2:1", "[2001:db8::1]:1"} {
		if w := recordFrom(h, peer); w.Code != 200 {
			t.Fatalf("%s, first request: %d", peer, w.Code)
		}
	}
	for _, peer := range []string{"192.0.2.1:2", "[2001:db8::2]:1"} {
		if w := recordFrom(h, peer); w.Code != 429 {
			t.Fatalf("%s, second request: %d", peer, w.Code)
		}
	}
}

// Behind a named proxy, the client is the first address of
// X-Forwarded-For, read from the right, outside the proxies.
func TestLimitByIPTrustedProxy(t *testing.T) {
	lim, _ := manualLimiter()
	h := httpgate.LimitByIP(1, time.Hour, httpgate.WithLimiter(lim),
		httpgate.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")))(hello)
	for _, client := range []string{"198.51.100.1", "198.51.100.2"} {
		if w := recordFrom(h, "10.0.0.5:443", "X-Forwarded-For", client); w.Code != 200 {
			t.Fatalf("%s through the proxy: %d", client, w.Code)
		}
	}
	// The same client again, through another of the proxies, and with a
	// hop it made up in front of its real address.
	if w := recordFrom(h, "10.0.0.6:443", "X-Forwarded-For", "203.0.113.9, 198.51.100.1"); w.Code != 429 {
		t.Fatalf("198.51.100.1 again: %d", w.Code)
	}
	// A peer that is not a proxy is its own client, whatever it forwards.
	if w := recordFrom(h, "198.51.100.3:1", "X-Forwarded-For", "198.51.100.4"); w.Code != 200 {
		t.Fatalf("direct client: %d", w.Code)
	}
	if w := recordFrom(h, "198.51.100.3:2", "X-Forwarded-For", "198.51.100.5"); w.Code != 429 {
		t.Fatalf("direct client forwarding another address: %d", w.Code)
	}
}

// Behind proxies that write Forwarded, WithClientHeader reads that header
// alone: an X-Forwarded-For the client sent names no address.
func TestLimitByIPClientHeader(t *testing.T) {
	lim, _ := manualLimiter()
	h := httpgate.LimitByIP(1, time.Hour, httpgate.WithLimiter(lim),
		httpgate.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")), httpgate.WithClientHeader("Forwarded"))(hello)
	if w := recordFrom(h, "10.0.0.5:443", "Forwarded", "for=198.51.100.1", "X-Forwarded-For", "203.0.113.1"); w.Code != 200 {
		t.Fatalf("first request: %d", w.Code)
	}
	if w := recordFrom(h, "10.0.0.5:443", "Forwarded", "for=198.51.100.1", "X-Forwarded-For", "203.0.113.2"); w.Code != 429 {
		t.Fatalf("the same client with another X-Forwarded-For: %d, want 429", w.Code)
	}
	if w := recordFrom(h, "10.0.0.5:443", "Forwarded", `for="[2001:db8::7]:443"`); w.Code != 200 {
		t.Fatalf("another client: %d", w.Code)
	}
	defer func() {
		if recover() == nil {
			t.Error("WithClientHeader(\"X Real IP\") did not panic")
		}
	}()
	httpgate.LimitByIP(1, time.Hour, httpgate.WithClientHeader("X Real IP"))
}

// Each header value is a bucket; requests without the header share one.
func TestLimitByHeader(t *testing.T) {
	lim, _ := manualLimiter()
	h := httpgate.LimitByHeader("X-API-Key", 1, time.Hour, httpgate.WithLimiter(lim))(hello)
	for _, key := range []string{"k1", "k2"} {
		if w := recordFrom(h, "192.0.2.1:1", "X-API-Key", key); w.Code != 200 {
			t.Fatalf("key %s: %d", key, w.Code)
		}
	}
	if w := recordFrom(h, "192.0.2.2:1", "X-API-Key", "k1"); w.Code != 429 {
		t.Fatalf("key k1 from another address: %d", w.Code)
	}
	if w := recordFrom(h, "192.0.2.1:1"); w.Code != 200 {
		t.Fatalf("no key: %d", w.Code)
	}
	if w := recordFrom(h, "192.0.2.3:1"); w.Code != 429 {
		t.Fatalf("no key again, from another address: %d", w.Code)
	}
	if got := recordFrom(h, "192.0.2.4:1", "X-API-Key", "k3").Header().Get("RateLimit-Policy"); got != `"header-x-api-key-1-per-1h";q=1;w=3600` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
}

// One bucket for every client.
func TestLimitGlobal(t *testing.T) {
	lim, clk := manualLimiter()
	h := httpgate.LimitGlobal(2, time.Second, httpgate.WithLimiter(lim))(hello)
	codes := []int{}
	for _, peer := range []string{"192.0.2.1:1", "192.0.2.2:1", "192.0.2.3:1"} {
		codes = append(codes, recordFrom(h, peer).Code)
	}
	clk.Advance(500 * time.Millisecond)
	codes = append(codes, recordFrom(h, "192.0.2.4:1").Code)
	if fmt.Sprint(codes) != "[200 200 429 200]" {
		t.Fatalf("codes %v", codes)
	}
}

// Limits sharing a store keep their own buckets: the default name says
// what, how many and per what.
func TestCodeLimitsShareAStoreApart(t *testing.T) {
	lim, _ := manualLimiter()
	perMinute := httpgate.LimitByIP(1, time.Minute, httpgate.WithLimiter(lim))(hello)
	perHour := httpgate.LimitByIP(1, time.Hour, httpgate.WithLimiter(lim))(hello)
	for i, h := range []http.Handler{perMinute, perHour} {
		if w := recordFrom(h, "192.0.2.1:1"); w.Code != 200 {
			t.Fatalf("limit %d, first request: %d (a bucket shared with the other limit)", i, w.Code)
		}
	}
	if got := recordFrom(perHour, "192.0.2.1:1").Header().Get("RateLimit-Policy"); got != `"ip-1-per-1h";q=1;w=3600` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
	named := httpgate.LimitByIP(1, time.Minute, httpgate.WithLimiter(lim), httpgate.WithName("api"))(hello)
	if got := recordFrom(named, "192.0.2.1:1").Header().Get("RateLimit-Policy"); got != `"api";q=1;w=60` {
		t.Fatalf("WithName: RateLimit-Policy %q", got)
	}
}

// The other algorithms count n per period too; a sliding log never
// admits more than n in any period.
func TestLimitByIPAlgorithms(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog} {
		lim, _ := manualLimiter()
		h := httpgate.LimitByIP(2, time.Minute, httpgate.WithLimiter(lim), httpgate.WithAlgorithm(alg))(hello)
		var codes []int
		for range 3 {
			codes = append(codes, recordFrom(h, "192.0.2.1:1").Code)
		}
		if fmt.Sprint(codes) != "[200 200 429]" {
			t.Errorf("%s: %v", alg, codes)
		}
	}
}

// Arguments that admit nothing are a programming error, found at start.
func TestCodeLimitPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"n 0":          func() { httpgate.LimitByIP(0, time.Minute) },
		"negative per": func() { httpgate.LimitGlobal(1, -time.Second) },
		"leaky bucket": func() { httpgate.LimitGlobal(1, time.Second, httpgate.WithAlgorithm(sluice.LeakyBucket)) },
		"bad name":     func() { httpgate.LimitGlobal(1, time.Second, httpgate.WithName("a b")) },
		"bad header":   func() { httpgate.LimitByHeader("X Key", 1, time.Second) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// Attack: a client behind no proxy sends a fresh forwarding header with
// every request (X-Forwarded-For, Forwarded, X-Real-IP, True-Client-IP,
// CF-Connecting-IP) to be counted as a new client each time. LimitByIP
// without trusted proxies counts the connection's peer and nothing else.
func TestAttackLimitByIPForgedForwardingHeaders(t *testing.T) {
	lim, _ := manualLimiter()
	h := httpgate.LimitByIP(3, time.Hour, httpgate.WithLimiter(lim))(hello)
	admitted := 0
	for i := range 50 {
		fake := fmt.Sprintf("203.0.113.%d", i)
		w := recordFrom(h, "198.51.100.7:40000",
			"X-Forwarded-For", fake, "Forwarded", "for="+fake, "X-Real-IP", fake,
			"True-Client-IP", fake, "CF-Connecting-IP", fake)
		if w.Code == 200 {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("%d of 50 requests with forged forwarding headers admitted, want the limit of 3", admitted)
	}
}

// Attack: behind a trusted proxy that appends to X-Forwarded-For, a
// client puts made-up addresses in front of its own, hoping the left-most
// one is taken for it. The walk from the right stops at the first
// address outside the proxies: the client's real one.
func TestAttackLimitByIPForgedHopsBehindProxy(t *testing.T) {
	lim, _ := manualLimiter()
	h := httpgate.LimitByIP(3, time.Hour, httpgate.WithLimiter(lim),
		httpgate.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")))(hello)
	admitted := 0
	for i := range 50 {
		xff := fmt.Sprintf("203.0.113.%d, 10.9.9.9, 198.51.100.7", i)
		if w := recordFrom(h, "10.0.0.2:443", "X-Forwarded-For", xff); w.Code == 200 {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("%d of 50 requests with forged hops admitted, want the limit of 3", admitted)
	}
}

// Attack: a header value made to look like another key's bucket (the
// separator of composite keys, a Redis Cluster hash tag) reaches only its
// own bucket.
func TestAttackLimitByHeaderKeyInjection(t *testing.T) {
	lim, _ := manualLimiter()
	h := httpgate.LimitByHeader("X-Tenant", 1, time.Hour, httpgate.WithLimiter(lim))(hello)
	if w := recordFrom(h, "192.0.2.1:1", "X-Tenant", "acme"); w.Code != 200 {
		t.Fatalf("acme: %d", w.Code)
	}
	for _, v := range []string{"acme|x", "{acme}", "acme%7C", "(absent)"} {
		if w := recordFrom(h, "192.0.2.1:1", "X-Tenant", v); w.Code != 200 {
			t.Errorf("%q shares a bucket with another value: %d", v, w.Code)
		}
	}
	if w := recordFrom(h, "192.0.2.1:1"); w.Code != 200 {
		t.Errorf("no header shares the bucket of the value (absent): %d", w.Code)
	}
}

// Attack: stacked LimitByIP(LimitByHeader(app)) charged the outer limit
// for requests the inner one rejected. A client spending one API key's
// budget (or sending a key that is over its limit) drained its address's
// bucket too, so that its other keys were refused with nothing served.
// Stacked simple middlewares are all or nothing: the outer one gives back
// what the inner one refused.
func TestAttackStackedSimpleMiddlewaresAllOrNothing(t *testing.T) {
	lim, _ := manualLimiter()
	served := 0
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ })
	h := httpgate.LimitByIP(5, time.Hour, httpgate.WithLimiter(lim))(
		httpgate.LimitByHeader("X-Api-Key", 1, time.Hour, httpgate.WithLimiter(lim))(
			httpgate.LimitGlobal(100, time.Hour, httpgate.WithLimiter(lim))(app)))
	codes := map[int]int{}
	for range 20 {
		codes[recordFrom(h, "198.51.100.7:40000", "X-Api-Key", "spent").Code]++
	}
	if codes[200] != 1 || codes[429] != 19 || served != 1 {
		t.Fatalf("one key of 1 an hour, 20 requests: %v, %d served; want 1 admitted", codes, served)
	}
	// The address has used one of its 5: four other keys still pass.
	for i := range 4 {
		if w := recordFrom(h, "198.51.100.7:40000", "X-Api-Key", fmt.Sprintf("other-%d", i)); w.Code != 200 {
			t.Fatalf("key other-%d from the same address: %d, want 200: the inner rejections were charged to the address\n%s", i, w.Code, dump(w))
		}
	}
	if w := recordFrom(h, "198.51.100.7:40000", "X-Api-Key", "sixth"); w.Code != 429 {
		t.Fatalf("the address's sixth admitted request: %d, want 429", w.Code)
	}
	if served != 5 {
		t.Fatalf("%d requests served, want 5", served)
	}

	// Three deep, the innermost refusing: both layers above give back.
	lim, _ = manualLimiter()
	h = httpgate.LimitByIP(3, time.Hour, httpgate.WithLimiter(lim))(
		httpgate.LimitByHeader("X-Api-Key", 3, time.Hour, httpgate.WithLimiter(lim))(
			httpgate.LimitByHeader("X-Tenant", 1, time.Hour, httpgate.WithLimiter(lim))(app)))
	for range 10 {
		recordFrom(h, "198.51.100.8:1", "X-Api-Key", "k", "X-Tenant", "busy")
	}
	for i := range 2 {
		if w := recordFrom(h, "198.51.100.8:1", "X-Api-Key", "k", "X-Tenant", fmt.Sprintf("t%d", i)); w.Code != 200 {
			t.Fatalf("another tenant after the innermost refusals: %d, want 200\n%s", w.Code, dump(w))
		}
	}
	if w := recordFrom(h, "198.51.100.8:1", "X-Api-Key", "k", "X-Tenant", "t9"); w.Code != 429 {
		t.Fatalf("the fourth admitted request of the key: %d, want 429", w.Code)
	}
}

// Attack: stacked simple middlewares give the outer charge back when an
// inner layer refuses, and a refund counts in the window of its moment. A
// middleware between the layers that holds a request (reading a body the
// client trickles) let a client's request, charged to a shared fixed
// window just before its end, be refused by the client's own spent key
// after it, and the refund gave the next window the charge again: that
// window admitted more than its capacity. A fixed window now gives back
// only inside the window the charge counted in.
func TestAttackStackedRefundCarriesIntoNextWindow(t *testing.T) {
	lim, clk := manualLimiter()
	var h http.Handler
	slow := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Slow") != "" {
				// The body arrives a window later, and meanwhile other
				// clients spend the new window.
				clk.Advance(time.Minute)
				for i := range 3 {
					if w := recordFrom(h, fmt.Sprintf("198.51.100.%d:1", 10+i), "X-Api-Key", fmt.Sprintf("other-%d", i)); w.Code != 200 {
						t.Errorf("another client's request %d in the new window: %d, want 200\n%s", i, w.Code, dump(w))
					}
				}
			}
			next.ServeHTTP(w, r)
		})
	}
	h = httpgate.LimitGlobal(3, time.Minute, httpgate.WithLimiter(lim), httpgate.WithAlgorithm(sluice.FixedWindow))(
		slow(httpgate.LimitByHeader("X-Api-Key", 1, time.Hour, httpgate.WithLimiter(lim))(hello)))
	if w := recordFrom(h, "198.51.100.7:1", "X-Api-Key", "spent"); w.Code != 200 {
		t.Fatalf("the key's one request: %d\n%s", w.Code, dump(w))
	}
	if w := recordFrom(h, "198.51.100.7:1", "X-Api-Key", "spent", "X-Slow", "1"); w.Code != 429 {
		t.Fatalf("the spent key's slow request: %d, want 429 from its own limit\n%s", w.Code, dump(w))
	}
	if w := recordFrom(h, "198.51.100.20:1", "X-Api-Key", "fresh"); w.Code != 429 {
		t.Fatalf("a fourth request in a window of 3: %d, want 429: the refund of the last window's charge landed in this one\n%s", w.Code, dump(w))
	}
	// Inside one window the outer charge is still given back.
	clk.Advance(time.Minute)
	for range 5 {
		recordFrom(h, "198.51.100.7:1", "X-Api-Key", "spent")
	}
	for i := range 3 {
		if w := recordFrom(h, "198.51.100.30:1", "X-Api-Key", fmt.Sprintf("late-%d", i)); w.Code != 200 {
			t.Fatalf("request %d of 3 after the spent key's refusals in the same window: %d, want 200\n%s", i, w.Code, dump(w))
		}
	}
}

// A sliding log outside a refusing layer keeps its charge: a refund takes
// out the log's newest entry, by then perhaps a later request's, which
// would free room before the refused request's own entry expires.
func TestStackedSlidingLogKeepsCharge(t *testing.T) {
	lim, _ := manualLimiter()
	h := httpgate.LimitGlobal(2, time.Minute, httpgate.WithLimiter(lim), httpgate.WithAlgorithm(sluice.SlidingLog))(
		httpgate.LimitByHeader("X-Api-Key", 1, time.Hour, httpgate.WithLimiter(lim))(hello))
	for i, want := range []int{200, 429, 429} {
		if w := recordFrom(h, "198.51.100.7:1", "X-Api-Key", []string{"spent", "spent", "fresh"}[i]); w.Code != want {
			t.Fatalf("request %d: %d, want %d\n%s", i, w.Code, want, dump(w))
		}
	}
}
