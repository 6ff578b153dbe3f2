package httpgate_test

import (
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/memory"
)

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

// Attack: a caller settles a take at once, claiming it used nothing, and
// settles the same handle again when its nonce has refilled, SettleTTL
// later, in the last second before the expiry (which a handle writes in
// whole seconds): a second refund of a take refunded already. The nonce
// refills only once the handle is no longer good.
func TestAttackSettleHandleReplayedAtExpiry(t *testing.T) {
	e := newEnv(t, llmPolicy)
	e.takeHandle("api", "k", 500)
	h := e.takeHandle("api", "k", 100)
	if status, m := e.settleStatus(h, 0); status != 200 || m["refunded"] != 100.0 {
		t.Fatalf("the first settlement: %d %v", status, m)
	}
	e.takeHandle("api", "k", 100)
	e.clk.Advance(httpgate.DefaultSettleTTL)
	if status, m := e.settleStatus(h, 0); status == 200 {
		t.Fatalf("the handle settled again as its expiry came: %d %v, want 403", status, m)
	}
}

// aheadClock is a server's clock running ahead of the others'.
type aheadClock struct {
	sluice.Clock
	by time.Duration
}

func (c aheadClock) Now() time.Time { return c.Clock.Now().Add(c.by) }

// Attack: in a fleet, the server that issued a handle runs a few seconds
// ahead of another (clocks are never quite together), so the handle
// expires later, on the other's clock, than a nonce spent at once
// refills. The caller settles at once, then sends the handle again to
// the server behind, at the moment the nonce refills, until one lands.
// A spent nonce outlives its handle on any clock within a minute of its
// issuer's.
func TestAttackSettleHandleReplayedOnLaggingServer(t *testing.T) {
	key := strings.Repeat("s", 32)
	t.Setenv("SETTLE_KEY", key)
	p := mustPolicy(t, "settle_secret_env: SETTLE_KEY\n"+llmPolicy)
	clk := sluice.NewManualClock(sluiceEpoch)
	store := memory.New(memory.Options{Clock: clk})
	gate := func(c sluice.Clock) *served {
		lim := sluice.NewWithOptions(store, sluice.Options{Clock: c})
		g := httpgate.New(p, lim, httpgate.Options{Getenv: func(string) string { return key }, Logger: slog.New(slog.DiscardHandler)})
		return serve(t, g.Handler())
	}
	ahead, behind := gate(aheadClock{clk, 5 * time.Second}), gate(clk)
	call(t, ahead, "/v1/take", `{"rule":"api","key":"k","cost":500}`)
	_, take := call(t, ahead, "/v1/take", `{"rule":"api","key":"k","cost":100}`)
	h := between(take, `"settle":"`, `"`)
	if status, body := call(t, behind, "/v1/settle", fmt.Sprintf(`{"handle":%q,"actual":0}`, h)); status != 200 {
		t.Fatalf("the first settlement: %d %s", status, body)
	}
	clk.Advance(httpgate.DefaultSettleTTL)
	if status, body := call(t, behind, "/v1/settle", fmt.Sprintf(`{"handle":%q,"actual":0}`, h)); status == 200 {
		t.Fatalf("the handle settled again on the server behind: %d %s", status, body)
	}
}
