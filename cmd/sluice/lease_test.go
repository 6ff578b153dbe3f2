package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/lockedbuf"
	"github.com/sluicehq/sluice/internal/redistest"
)

// Two processes serve a leased rule on one Redis: each answers from its
// slices, the metrics show them, and a process that stops gives what is
// left of its slice back to the store.
func TestServeLeasedRedis(t *testing.T) {
	addr := redistest.Server(t)
	cfg := writePolicy(t, leasedPolicy(addr, "1h"))
	ctx, stopA := context.WithCancel(context.Background())
	defer stopA()
	readyA, exitedA, logsA := make(chan listening, 1), make(chan int, 1), &lockedbuf.Buffer{}
	go func() {
		exitedA <- serve(ctx, []string{"--shutdown-drain", "0", "--listen", "127.0.0.1:0", "--grpc-listen", "off", "--config", cfg}, logsA, func(l listening) { readyA <- l })
	}()
	var a listening
	select {
	case a = <-readyA:
	case code := <-exitedA:
		t.Fatalf("serve exited %d:\n%s", code, logsA.String())
	}
	b, _ := startServe(t, "--config", cfg)
	admitted := 0
	for i := range 150 {
		api := a.API
		if i%2 == 1 {
			api = b.API
		}
		if d := take(t, api, `{"rule":"shared","key":"k"}`); admittedByRedis(d) {
			admitted++
		}
	}
	// 200 tokens, at most 10 held unused by each process: all 150 pass.
	if admitted != 150 {
		t.Fatalf("admitted %d of 150 within a capacity of 200", admitted)
	}
	metricsA := scrape(t, a.API)
	taken := metricValue(t, metricsA, `sluice_lease_slices_taken_total{rule="shared"}`)
	held := metricValue(t, metricsA, `sluice_lease_tokens_held{rule="shared"}`)
	if taken < 1 || taken > 75 || held < 0 || held > 10 {
		t.Fatalf("process a took %v slices and holds %v tokens; want fewer slices than its 75 requests and at most 10 held:\n%s", taken, held, metricsA)
	}
	before := peekRemaining(t, b.API)
	t.Logf("process a: %v slices taken, %v tokens held; the store has %d left", taken, held, before)
	stopA()
	select {
	case code := <-exitedA:
		if code != 0 {
			t.Fatalf("serve exited %d:\n%s", code, logsA.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not stop:\n%s", logsA.String())
	}
	if after := peekRemaining(t, b.API); after < before+int(held)-1 {
		t.Errorf("after a stopped, the store has %d tokens left, %d before: its %v held tokens did not come back", after, before, held)
	}
}

func scrape(t *testing.T, api string) string {
	t.Helper()
	resp, err := http.Get("http://" + api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

func metricValue(t *testing.T, body, series string) float64 {
	t.Helper()
	m := regexp.MustCompile("(?m)^" + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in /metrics:\n%s", series, body)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func peekRemaining(t *testing.T, api string) int {
	t.Helper()
	d := peek(t, api, `{"rule":"shared","key":"k"}`)
	n, ok := d["remaining"].(float64)
	if !ok {
		t.Fatalf("peek: %v", d)
	}
	return int(n)
}

// sluice check prints each leased rule's bound: per process, and for a
// fleet of three.
func TestCheckPrintsLeaseBound(t *testing.T) {
	cfg := writePolicy(t, "rules:\n  - name: provider\n    limit_keys: []\n    algorithm_config:\n      rps: 20000\n      burst: 20000\n      lease: {}\n"+
		"  - name: small\n    limit_keys: []\n    algorithm_config:\n      rps: 10\n      burst: 10\n      lease: {}\n")
	var out, errs strings.Builder
	if code := runCheck([]string{cfg}, &out, &errs); code != 0 {
		t.Fatalf("check exited %d: %s", code, errs.String())
	}
	for _, want := range []string{
		"note: " + cfg + ":7: rules[0].algorithm_config.lease: each process holds at most 60 tokens of a key (the max slice, 0.3% of the capacity 20000): over any interval the fleet admits at most processes x 60 beyond the exact limit (180 for 3 processes, 0.9%)",
		"note: " + cfg + ":13: rules[1].algorithm_config.lease: the max slice is under 2 tokens: the rule stays exact",
		"note: " + cfg + ": lease: the memory store decides every request in one process, exactly: nothing is leased",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check printed:\n%s\nwant a line with:\n%s", out.String(), want)
		}
	}
}

// A reload that drops a rule's lease: section gives its slices back, and
// the rule is exact from then on.
func TestServeLeasedReload(t *testing.T) {
	old := reloadPoll
	reloadPoll = 10 * time.Millisecond
	t.Cleanup(func() { reloadPoll = old })
	addr := redistest.Server(t)
	conf := leasedPolicy(addr, "1m")
	cfg := writePolicy(t, conf)
	l, _ := startServe(t, "--config", cfg)
	for range 21 {
		if d := take(t, l.API, `{"rule":"shared","key":"k"}`); !admittedByRedis(d) {
			t.Fatalf("take: %v", d)
		}
	}
	if held := metricValue(t, scrape(t, l.API), `sluice_lease_tokens_held{rule="shared"}`); held <= 0 {
		t.Fatalf("no slice held after 21 requests (%v)", held)
	}
	replaceFile(t, cfg, strings.Replace(conf, "      lease: {max_slice: 10, hot_after: 1, term: 1m}\n", "", 1))
	waitReloads(t, l.API, 1, 0)
	// Every token not admitted is back in the store: 200 - 21, less the
	// one a peek answers after.
	if got := peekRemaining(t, l.API); got < 200-21-1 { // the refill may add to it, never take
		t.Errorf("after the reload the store has %d left, want %d: the slice was not returned", got, 200-21-1)
	}
	if body := scrape(t, l.API); strings.Contains(body, `sluice_lease_tokens_held{rule="shared"}`) {
		t.Errorf("an exact rule still has lease metrics:\n%s", body)
	}
}

// leasedPolicy is the leased rule these tests serve on the Redis at addr,
// its slices held for term.
func leasedPolicy(addr, term string) string {
	return fmt.Sprintf(`store:
  url: redis://%s/0?timeout=10s&dial_timeout=30s&write_timeout=30s
rules:
  - name: shared
    algorithm_config:
      rate: 1
      period: 1h
      capacity: 200
      lease: {max_slice: 10, hot_after: 1, term: %s}
`, addr, term)
}
