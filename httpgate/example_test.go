package httpgate_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

func ExampleMiddleware() {
	pol, err := policy.Parse("inline.yaml", []byte(`
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm: token_bucket
    algorithm_config: {rps: 1, burst: 2}
`))
	if err != nil {
		panic(err)
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })
	h := httpgate.Middleware(pol, sluice.New(memory.New(memory.Options{})), httpgate.Options{})(app)

	for i := 0; i < 3; i++ {
		w := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		h.ServeHTTP(w, req)
		fmt.Printf("%d %s retry-after=%q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 "per-ip";r=1;t=1 retry-after=""
	// 200 "per-ip";r=0;t=2 retry-after=""
	// 429 "per-ip";r=0;t=1 retry-after="1"
}

// The middleware snippet of docs/library.md: limits from a configuration file
// (policy.Load reports every problem as FILE:LINE: path: message), on a
// store of the program's choosing. It listens, so it is compiled but not
// run.
func ExampleMiddleware_load() {
	pol, err := policy.Load("sluice.yaml")
	if err != nil {
		log.Fatal(err)
	}
	store := memory.New(memory.Options{}) // or redis.Open(url, redis.Options{}), postgres.Open(ctx, url, postgres.Options{})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })

	mw := httpgate.Middleware(pol, sluice.New(store), httpgate.Options{})
	log.Fatal(http.ListenAndServe(":8080", mw(app)))
}
