// Command library is sluice as a library in a net/http app: every client
// address gets 100 requests a minute (the httpgate.LimitByIP middleware),
// and each user 5 report exports an hour, checked in the handler with
// Limiter.Take.
//
//	go run ./examples/recipes/library
//	curl -s -i -X POST -H 'X-User: alice' 127.0.0.1:8080/reports
package main

import (
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
)

// exports allows 5 exports at once, then one every 12 minutes.
var exports = sluice.MustLimit(sluice.Spec{Name: "exports-per-user", Rate: 5, Period: time.Hour, Capacity: 5})

// newApp is the app's handler; lim keeps every bucket (the middleware's
// too), so a test can give it a store on a manual clock.
func newApp(lim *sluice.Limiter) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
	})
	mux.HandleFunc("POST /reports", func(w http.ResponseWriter, r *http.Request) {
		user := r.Header.Get("X-User") // in a real app: the authenticated user
		d, err := lim.Take(r.Context(), sluice.Request{Limit: exports, Key: user, Cost: 1})
		if err != nil {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		if !d.Allowed {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.RetryAfter.Seconds()))))
			http.Error(w, "export limit reached", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintf(w, "export started, %d left\n", d.Remaining)
	})
	return httpgate.LimitByIP(100, time.Minute, httpgate.WithLimiter(lim))(mux)
}

func main() {
	lim := sluice.New(memory.New(memory.Options{})) // or redis.Open(url, redis.Options{}) for a fleet
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: newApp(lim), ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
