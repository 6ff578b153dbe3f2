package httpgate_test

import (
	"fmt"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httpgate"
)

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
