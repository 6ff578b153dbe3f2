package httpgate_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/sluicehq/sluice/httpgate"
)

// "100 per minute per IP" in one line; here 2 per minute, so that the
// third request from one address is refused. A rejection is the
// configured middleware's: 429, Retry-After, the RateLimit fields and an
// application/problem+json body.
func ExampleLimitByIP() {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })
	h := httpgate.LimitByIP(2, time.Minute)(app) // http.ListenAndServe(":8080", h)

	for range 3 {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("Content-Type"))
	}
	// Output:
	// 200 "ip-2-per-1m";q=2;w=60 text/plain; charset=utf-8
	// 200 "ip-2-per-1m";q=2;w=60 text/plain; charset=utf-8
	// 429 "ip-2-per-1m";q=2;w=60 application/problem+json
}

// Behind a load balancer, name it: its X-Forwarded-For is then believed,
// and every other peer's is ignored.
func ExampleWithTrustedProxies() {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	h := httpgate.LimitByIP(1, time.Hour,
		httpgate.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")))(app)

	send := func(peer, xff string) int {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr, req.Header["X-Forwarded-For"] = peer, []string{xff}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	fmt.Println(send("10.0.0.2:1", "198.51.100.1"))    // through the balancer
	fmt.Println(send("10.0.0.2:1", "198.51.100.2"))    // another client through it
	fmt.Println(send("10.0.0.3:1", "198.51.100.1"))    // the first client again
	fmt.Println(send("198.51.100.1:1", "203.0.113.7")) // the first client, directly, posing as another
	// Output:
	// 200
	// 200
	// 429
	// 429
}

// Limits stack: per API key inside per address inside a global cap.
func ExampleLimitByHeader() {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	h := httpgate.LimitGlobal(1000, time.Second)(
		httpgate.LimitByIP(100, time.Minute)(
			httpgate.LimitByHeader("X-API-Key", 2, time.Minute)(app)))

	for _, key := range []string{"k1", "k1", "k1", "k2"} {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		fmt.Println(key, w.Code)
	}
	// Output:
	// k1 200
	// k1 200
	// k1 429
	// k2 200
}

// The one line of docs/library.md: a server whose every client address may send
// 100 requests a minute. It listens, so it is compiled but not run.
func ExampleLimitByIP_listen() {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })
	log.Fatal(http.ListenAndServe(":8080", httpgate.LimitByIP(100, time.Minute)(app)))
}
