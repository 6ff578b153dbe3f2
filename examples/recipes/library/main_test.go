// The recipe's app on a manual clock:
//
//	go test ./examples/recipes/library

package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// TestLibraryRecipe serves the recipe's app on a manual clock: 5 exports
// per user, then a 429 with Retry-After until one refills; 100 requests
// per address, then LimitByIP's 429.
func TestLibraryRecipe(t *testing.T) {
	clk := sluice.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	app := newApp(sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk}))
	do := func(method, path, user, addr string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, nil)
		req.RemoteAddr = addr
		req.Header.Set("X-User", user)
		rec := httptest.NewRecorder()
		app.ServeHTTP(rec, req)
		return rec
	}
	for i := 0; i < 5; i++ {
		if rec := do("POST", "/reports", "alice", "192.0.2.1:1000"); rec.Code != http.StatusOK {
			t.Fatalf("export %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	rec := do("POST", "/reports", "alice", "192.0.2.1:1000")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "720" {
		t.Fatalf("sixth export: %d, Retry-After %q, want 429 after 720 s", rec.Code, rec.Header().Get("Retry-After"))
	}
	if rec := do("POST", "/reports", "bob", "192.0.2.1:1000"); rec.Code != http.StatusOK {
		t.Fatalf("another user's export: %d", rec.Code)
	}
	clk.Advance(12 * time.Minute)
	if rec := do("POST", "/reports", "alice", "192.0.2.1:1000"); rec.Code != http.StatusOK {
		t.Fatalf("export after 12 minutes: %d", rec.Code)
	}

	for i := 0; i < 100; i++ {
		if rec := do("GET", "/hello", "", "192.0.2.2:1000"); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}
	rec = do("GET", "/hello", "", "192.0.2.2:1000")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" || rec.Header().Get("RateLimit") == "" {
		t.Fatalf("request 101: %d %v", rec.Code, rec.Header())
	}
	if rec := do("GET", "/hello", "", "192.0.2.3:1000"); rec.Code != http.StatusOK {
		t.Fatalf("another address: %d", rec.Code)
	}
}
