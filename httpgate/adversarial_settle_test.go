package httpgate_test

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// Attack: the rule settles from a response header, and the upstream
// echoes request headers (debug echo, CORS reflection, a framework that
// copies them). The client sends the header itself, "X-Usage-Tokens: 0",
// so that the upstream states a cost of nothing and the charge is
// refunded whole. The proxy drops every settle_from header and trailer
// from requests: the upstream never sees the client's, and the charge
// settles at what the upstream itself reports.
func TestAttackClientStatesItsOwnCost(t *testing.T) {
	e := newLLMEnv(t, strings.Replace(llmPolicy, "match: {path_prefix: /header}", "match: {path_prefix: /echo}", 1))
	for i := range 3 {
		status, body := call(t, e.proxy, "/echo", "", "X-Api-Key", "k1", "X-Estimate", "100", "X-Test-Usage", "90",
			"X-Usage-Tokens", "0", "x-usage-tokens", "0")
		if status != 200 {
			t.Fatalf("%d %s", status, body)
		}
		if got, want := e.level("by-header", "k1"), 1000-90*float64(i+1); got != want {
			t.Fatalf("request %d: the bucket holds %v, want %v: the client's own X-Usage-Tokens settled the charge", i, got, want)
		}
	}
	for _, h := range e.up.seen {
		if v := h.Values("X-Usage-Tokens"); len(v) > 0 {
			t.Fatalf("the upstream saw the client's X-Usage-Tokens %q", v)
		}
	}
}

// tamper re-encodes the payload of a handle with change applied, keeping
// its MAC.
func tamper(t *testing.T, h string, change func([]byte) []byte) string {
	t.Helper()
	pl64, sum, ok := strings.Cut(h, ".")
	pl, err := base64.RawURLEncoding.DecodeString(pl64)
	if !ok || err != nil {
		t.Fatalf("handle %q is not payload.mac", h)
	}
	return base64.RawURLEncoding.EncodeToString(change(pl)) + "." + sum
}

// settleStatus sends a handle and an actual cost to /v1/settle.
func (e *env) settleStatus(h string, actual float64) (int, map[string]any) {
	e.t.Helper()
	resp, m := e.post("/v1/settle", fmt.Sprintf(`{"handle":%q,"actual":%v}`, h, actual))
	return resp.StatusCode, m
}

// Attack: a decision API caller refunds what it was never charged: it
// makes up a handle, alters a real one to name another key (a victim's
// debt refunded, or a bucket it shares topped up), a larger charge (a
// larger refund), or another limit, or presents one signed by another
// process. Handles are signed with HMAC-SHA256: every one of them is a
// 403 and no bucket moves.
func TestAttackForgedSettleHandle(t *testing.T) {
	e := newEnv(t, llmPolicy)
	h := e.takeHandle("api", "mallory", 100)
	e.takeHandle("api", "victim", 500)
	forged := map[string]string{
		"made up": base64.RawURLEncoding.EncodeToString([]byte("\x01\x00\x00\x00\x00\x7f\xff\xff\xff\x00\x00\x00\x00\x3b\x9a\xca\x00................\x03apivictim")) +
			"." + base64.RawURLEncoding.EncodeToString(make([]byte, 32)),
		"another key": tamper(t, h, func(pl []byte) []byte { return append(pl[:len(pl)-len("mallory")], "victim"...) }),
		"more charged": tamper(t, h, func(pl []byte) []byte {
			pl[9] = 0x7f // the charged amount's top byte
			return pl
		}),
		"another limit": tamper(t, h, func(pl []byte) []byte {
			return append(append(append(pl[:33:33], byte(len("tokens"))), "tokens"...), "mallory"...)
		}),
		"longer expiry": tamper(t, h, func(pl []byte) []byte {
			pl[1] = 0x7f
			return pl
		}),
		"no mac": strings.Split(h, ".")[0],
	}
	other := newEnv(t, llmPolicy)
	forged["another process"] = other.takeHandle("api", "mallory", 100)
	for name, f := range forged {
		status, m := e.settleStatus(f, 0)
		if status != http.StatusForbidden && !(name == "no mac" && status == http.StatusBadRequest) {
			t.Errorf("%s: %d %v, want 403", name, status, m)
		}
	}
	if got := e.level("api", "victim"); got != 500 {
		t.Errorf("the victim's bucket holds %v, want 500: a forged handle refunded it", got)
	}
	if got := e.level("api", "mallory"); got != 900 {
		t.Errorf("mallory's bucket holds %v, want 900", got)
	}
	if got := e.level("tokens", "mallory"); got != 10000 {
		t.Errorf("tokens/mallory holds %v", got)
	}
	// The real handle still settles, once.
	if status, m := e.settleStatus(h, 0); status != 200 || m["refunded"] != 100.0 {
		t.Fatalf("the real handle: %d %v", status, m)
	}
}

// Attack: a caller settles one take many times (a replay), each time
// claiming it used nothing, to be refunded again and again; or sends the
// same handle from many connections at once, hoping two get through
// before either is recorded. Each handle's nonce is spent in the store in
// one atomic take before it settles: one settlement, then 409s.
func TestAttackReplayedSettleHandle(t *testing.T) {
	e := newEnv(t, llmPolicy)
	e.takeHandle("api", "k", 400)
	h := e.takeHandle("api", "k", 100)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(e.srv.URL+"/v1/settle", "application/json", strings.NewReader(fmt.Sprintf(`{"handle":%q,"actual":0}`, h)))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[200] != 1 || codes[409] != 15 {
		t.Fatalf("16 settlements of one handle at once: %v, want one 200 and fifteen 409s", codes)
	}
	if status, m := e.settleStatus(h, 0); status != http.StatusConflict || !strings.Contains(fmt.Sprint(m["detail"]), "settled already") {
		t.Fatalf("a later replay: %d %v", status, m)
	}
	if got := e.level("api", "k"); got != 600 {
		t.Fatalf("the bucket holds %v, want 600: the take of 100 was refunded more than once", got)
	}
}

// Attack: a caller keeps a handle and settles it much later, when the
// bucket has refilled or the policy has forgotten the take. A handle is
// good for Options.SettleTTL (an hour) after its take: then a 403.
func TestAttackExpiredSettleHandle(t *testing.T) {
	e := newEnv(t, llmPolicy)
	h := e.takeHandle("api", "k", 100)
	e.clk.Advance(httpgate.DefaultSettleTTL + time.Second)
	if status, m := e.settleStatus(h, 0); status != http.StatusForbidden || !strings.Contains(fmt.Sprint(m["detail"]), "expired") {
		t.Fatalf("a handle past its expiry: %d %v, want 403", status, m)
	}
}

// A fleet shares settle_secret_env: a handle one server issued settles on
// another, once across both, as they share the store.
func TestSettleHandleAcrossFleet(t *testing.T) {
	key := strings.Repeat("s", 32)
	t.Setenv("SETTLE_KEY", key)
	p := mustPolicy(t, "settle_secret_env: SETTLE_KEY\n"+llmPolicy)
	clk := sluice.NewManualClock(sluiceEpoch)
	store := memory.New(memory.Options{Clock: clk})
	gate := func() *served {
		lim := sluice.NewWithOptions(store, sluice.Options{Clock: clk})
		g := httpgate.New(p, lim, httpgate.Options{Getenv: func(string) string { return key }, Logger: slog.New(slog.DiscardHandler)})
		return serve(t, g.Handler())
	}
	a, b := gate(), gate()
	_, take := call(t, a, "/v1/take", `{"rule":"api","key":"k","cost":100}`)
	h := between(take, `"settle":"`, `"`)
	if status, body := call(t, b, "/v1/settle", fmt.Sprintf(`{"handle":%q,"actual":40}`, h)); status != 200 || !strings.Contains(body, `"refunded":60`) {
		t.Fatalf("settle on the other server: %d %s", status, body)
	}
	if status, _ := call(t, a, "/v1/settle", fmt.Sprintf(`{"handle":%q,"actual":0}`, h)); status != http.StatusConflict {
		t.Fatalf("the replay on the first server: %d, want 409", status)
	}
}

func between(s, from, to string) string {
	_, rest, _ := strings.Cut(s, from)
	v, _, _ := strings.Cut(rest, to)
	return v
}

// Attack: with a cost read from the request body, a client pays less than
// its request is worth by hiding the field where a partial read misses it
// or an upstream reads another: a body longer than what is read (a small
// max_tokens up front, padding after), a key given twice (the reader
// takes one, the upstream the other), or a body that is not quite JSON.
// Each costs at least default_cost, as a body without the field does; and
// the upstream reads every body whole.
func TestAttackBodyCostEvasion(t *testing.T) {
	e := newLLMEnv(t, llmPolicy)
	pad := strings.Repeat(" ", policy.CostBodyLimit)
	cases := []struct {
		name, body string
		want       float64
	}{
		{"a body past the limit", `{"max_tokens": 1, "messages": [` + pad + `]}`, 4000},
		{"a key given twice", `{"max_tokens": 1, "max_tokens": 9000}`, 9000},
		{"a key given twice, small last", `{"max_tokens": 9000, "max_tokens": 1}`, 9000},
		{"two JSON values", `{"max_tokens": 1} {"max_tokens": 9000}`, 4000},
		{"no field", `{"model": "m"}`, 4000},
	}
	for i, c := range cases {
		key := fmt.Sprintf("k%d", i)
		status, _ := call(t, e.proxy, "/v1/c", c.body, "X-Api-Key", key)
		if status != 200 {
			t.Fatalf("%s: %d", c.name, status)
		}
		if got := 10000 - e.level("tokens", key); got != c.want {
			t.Errorf("%s: charged %v, want %v", c.name, got, c.want)
		}
	}
	// The long body again, of no declared length (chunked): read up to
	// the limit, found longer, not parsed.
	req, _ := http.NewRequest("POST", e.proxy.URL+"/v1/c", io.MultiReader(strings.NewReader(cases[0].body)))
	req.Header.Set("X-Api-Key", "chunked")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("chunked: %v %v", resp, err)
	}
	resp.Body.Close()
	<-e.proxy.done
	if got := 10000 - e.level("tokens", "chunked"); got != 4000 {
		t.Errorf("a chunked body past the limit: charged %v, want 4000", got)
	}
	if want := fmt.Sprintf("%x", sha256.Sum256([]byte(cases[0].body))); e.up.bodies[0] != want || e.up.bodies[len(e.up.bodies)-1] != want {
		t.Error("the upstream did not read the long bodies whole")
	}
	for i, sum := range e.up.bodies {
		if len(sum) != 64 {
			t.Fatalf("request %d: the upstream did not read its body", i)
		}
	}
}

// Attack: many clients send large bodies at once to a rule that reads the
// cost from the body, to make the server hold them all in memory. The
// bodies held at once are bounded (Options.BodyMemory); a request beyond
// it is not read for its cost and pays default_cost, its body streamed to
// the upstream unread.
func TestAttackBodyMemory(t *testing.T) {
	clk := sluice.NewManualClock(sluiceEpoch)
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	// The upstream states no usage: each request is charged its estimate
	// (unsettled_cost is below every one), which shows what was read.
	p := mustPolicy(t, strings.Replace(llmPolicy, "unsettled_cost: 2000", "unsettled_cost: 1", 1))
	up := newLLMUpstream(t)
	upURL, _ := url.Parse(up.URL)
	g := httpgate.New(p, lim, httpgate.Options{BodyMemory: 100, Logger: slog.New(slog.DiscardHandler)})
	proxy := serve(t, g.Proxy(upURL, httpgate.ProxyOptions{}))
	small := `{"max_tokens": 7}`
	large := `{"max_tokens": 7, "pad": "` + strings.Repeat("x", 200) + `"}`
	call(t, proxy, "/v1/c", small, "X-Api-Key", "a")
	call(t, proxy, "/v1/c", large, "X-Api-Key", "b")
	if got := 10000 - conformance.Level(t, lim, p.Limit("tokens"), "a"); got != 7 {
		t.Errorf("a body within the memory bound: charged %v, want 7", got)
	}
	if got := 10000 - conformance.Level(t, lim, p.Limit("tokens"), "b"); got != 4000 {
		t.Errorf("a body beyond the memory bound: charged %v, want default_cost 4000", got)
	}
	if up.bodies[1] == "" {
		t.Error("the upstream did not get the large body")
	}
}

// A stream's event too large to hold, or a JSON response too large, is
// not read for its cost: the request is charged unsettled_cost, and the
// response passes whole.
func TestSettleBounds(t *testing.T) {
	big := strings.Repeat("y", 70<<10)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/event":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"usage\":{\"total_tokens\":3},\"pad\":\"%s\"}\n\n", big)
		case "/v1/line":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"usage\":{\"total_tokens\":3}}\n\ndata: {\"pad\":\"%s\",\"usage\":{\"total_tokens\":5}}\n\n", big)
		case "/v1/json":
			fmt.Fprintf(w, "{\"pad\":\"%s\",\"usage\":{\"total_tokens\":3}}", strings.Repeat(big, 16))
		}
	})
	clk := sluice.NewManualClock(sluiceEpoch)
	lim := sluice.NewWithOptions(memory.New(memory.Options{Clock: clk}), sluice.Options{Clock: clk})
	p := mustPolicy(t, llmPolicy)
	srv := serve(t, httpgate.Middleware(p, lim, httpgate.Options{})(app))
	for path, want := range map[string]float64{"/v1/event": 2000, "/v1/line": 3, "/v1/json": 2000} {
		key := strings.TrimPrefix(path, "/v1/")
		_, body := call(t, srv, path, `{"max_tokens": 100}`, "X-Api-Key", key)
		if !strings.Contains(body, big) {
			t.Errorf("%s: the response did not pass whole", path)
		}
		if got := 10000 - conformance.Level(t, lim, p.Limit("tokens"), key); got != want {
			t.Errorf("%s: charged %v, want %v", path, got, want)
		}
	}
}
