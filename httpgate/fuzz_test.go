package httpgate_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
)

// FuzzDecisionAPI feeds arbitrary bodies to /v1/take and /v1/peek: every
// answer is a 200 decision or a 4xx with a reason, never a 5xx or a panic.
// The seeds run as an ordinary test.
func FuzzDecisionAPI(f *testing.F) {
	for _, s := range []string{
		`{"rule":"per-user","key":"u1","cost":1}`,
		`{"rule":"per-user","key":"u1","cost":0.5,"reserve":true}`,
		`{"takes":[{"rule":"per-user","key":"a"},{"rule":"per-org","key":"b","cost":3}]}`,
		`{"rule":"watch","key":""}`,
		`{"rule":"per-user","key":"u","cost":4}`,
		`{"rule":"per-user","key":"u","cost":-0}`,
		`{"rule":"per-user","key":"u","cost":1e-7}`,
		`{"rule":"per-user","key":"u","cost":9007199254740993}`,
		`{"rule":"nope"}`,
		`{"takes":[]}`,
		`{"takes":null,"rule":"per-user"}`,
		`{"rule":"per-user","key":"\u0000{x}|:"}`,
		`{`, `[]`, `null`, `""`, ``,
	} {
		f.Add(s)
	}
	clk := sluice.NewManualClock(sluiceEpoch)
	g := httpgate.New(mustPolicyF(f, apiPolicy), sluice.New(memory.New(memory.Options{Clock: clk})), httpgate.Options{})
	h := g.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/take", "/v1/peek"} {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("POST", path, bytes.NewBufferString(body)))
			switch {
			case w.Code == http.StatusOK:
			case w.Code >= 400 && w.Code < 500:
				if !bytes.Contains(w.Body.Bytes(), []byte(`"detail"`)) {
					t.Fatalf("%s %q: %d without a reason: %s", path, body, w.Code, w.Body)
				}
			default:
				t.Fatalf("%s %q: status %d: %s", path, body, w.Code, w.Body)
			}
		}
	})
}
