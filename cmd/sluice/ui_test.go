package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testbin"
)

// The live page in a real browser: sluice serve runs in process, traffic
// goes through it, and headless Chromium opens /ui, runs its script and
// gives back the document it built (--dump-dom) or a picture of it.

const uiTestToken = "ui-test-admin-token-0123456789"

const uiTestPolicy = `
admin_token_env: SLUICE_UI_TEST_ADMIN_TOKEN
rules:
  - name: per-user
    limit_keys: ["header:X-User"]
    algorithm_config: {rate: 10, period: 1h}
  - name: login
    match: {path_prefix: /v1/auth}
    limit_keys: ["header:X-User"]
    algorithm: fixed_window
    algorithm_config: {rate: 30, period: 1m}
  - name: global
    mode: shadow
    algorithm_config: {rps: 20, burst: 40}
`

// startUIServe runs serve on uiTestPolicy, as policy.yaml in a directory
// of its own (the page shows the path), with its admin token set, and
// returns the decision API's address.
func startUIServe(t *testing.T) string {
	t.Helper()
	t.Setenv("SLUICE_UI_TEST_ADMIN_TOKEN", uiTestToken)
	t.Chdir(t.TempDir())
	if err := os.WriteFile("policy.yaml", []byte(uiTestPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	l, _ := startServe(t, "--config", "policy.yaml")
	return l.API
}

// drive sends n forward-auth calls for user, and reports how many were
// admitted.
func drive(t *testing.T, addr, user string, n int) (admitted int) {
	t.Helper()
	for range n {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v1/auth", nil)
		req.Header.Set("X-User", user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			admitted++
		}
	}
	return admitted
}

// chromium runs headless Chromium on the page with args (--dump-dom or
// --screenshot=FILE), logging in with the token in the address, and
// returns what it wrote to stdout. The page runs for five seconds of
// virtual time, which does not pass while its requests are in flight:
// two refreshes at least, at any machine's speed.
func chromium(t *testing.T, bin, addr string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	all := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=5000", "--window-size=1280,900",
	}, args...)
	all = append(all, "http://"+addr+"/ui?token="+url.QueryEscape(uiTestToken))
	cmd := exec.CommandContext(ctx, bin, all...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return string(out)
}

// ruleTotal reads a rule's total of outcome ("allowed", "rejected") over
// the window from the page's document.
func ruleTotal(t *testing.T, dom, rule, outcome string) int {
	t.Helper()
	re := regexp.MustCompile(`data-rule="` + regexp.QuoteMeta(rule) + `"[\s\S]*?data-total="` + outcome + `" data-value="(\d+)"`)
	m := re.FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("the page shows no %s total for rule %s:\n%s", outcome, rule, dom)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestUIInBrowser opens the live page in Chromium after driving traffic
// and checks what its script drew: every rule, the key driven hottest,
// and counts that move when more traffic comes. It saves a screenshot to
// $SLUICE_ARTIFACTS (default: the test's temporary directory), and to
// docs/ui.png, which the README shows, with SLUICE_UPDATE_SCREENSHOT=1.
func TestUIInBrowser(t *testing.T) {
	bin := testbin.Find(t, "chromium", "/usr/bin/chromium")
	// Paths as given, before startUIServe changes the directory.
	docs, err := filepath.Abs(filepath.Join("..", "..", "docs"))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("SLUICE_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if dir, err = filepath.Abs(dir); err != nil {
		t.Fatal(err)
	}
	addr := startUIServe(t)
	update := os.Getenv("SLUICE_UPDATE_SCREENSHOT") == "1"
	if update {
		// For the picture, a few seconds of traffic that varies, so that
		// the charts draw a shape rather than one spike.
		for i := range 8 {
			drive(t, addr, "mallory", 4+3*(i%3))
			drive(t, addr, fmt.Sprint("user-", i), 2)
			time.Sleep(time.Second)
		}
	}
	// hot-user: 30 calls on a bucket of 10 refilling 10 an hour: 20
	// rejections at any machine's speed.
	if n := drive(t, addr, "hot-user", 30); n != 10 {
		t.Errorf("hot-user: %d of 30 admitted, want 10", n)
	}
	for i := range 5 {
		drive(t, addr, fmt.Sprint("user-", i), 1)
	}

	// The page counts whole seconds: wait for the one of the last call to
	// end (a clock boundary, not tokens).
	secondEnds()
	first := chromium(t, bin, addr, "--dump-dom")
	if !strings.Contains(first, `data-state="ok"`) {
		t.Fatalf("the page's script did not draw the data:\n%s", first)
	}
	for _, rule := range []string{"per-user", "login", "global"} {
		if !strings.Contains(first, `data-rule="`+rule+`"`) {
			t.Errorf("rule %s is not on the page", rule)
		}
	}
	if !regexp.MustCompile(`<tr data-hot="decisions"><td class="key" title="hot-user">hot-user</td>`).MatchString(first) {
		t.Errorf("the key driven hottest is not in the traffic ranking:\n%s", first)
	}
	if !regexp.MustCompile(`<tr data-hot="rejections"><td class="key" title="hot-user">hot-user</td>`).MatchString(first) {
		t.Errorf("hot-user is not in the rejections ranking:\n%s", first)
	}
	before := ruleTotal(t, first, "global", "allowed") // shadow: counts every call
	if before < 35 {
		t.Errorf("global counted %d calls, want at least 35", before)
	}

	drive(t, addr, "late-user", 7)
	secondEnds()
	second := chromium(t, bin, addr, "--dump-dom")
	if after := ruleTotal(t, second, "global", "allowed"); after < before+7 {
		t.Errorf("global's count went from %d to %d after 7 more calls", before, after)
	}
	if !strings.Contains(second, `title="late-user">late-user</td>`) {
		t.Errorf("the second read does not show late-user")
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "ui.png")
	chromium(t, bin, addr, "--screenshot="+shot, "--hide-scrollbars")
	png, err := os.ReadFile(shot)
	if err != nil || len(png) < 8 || string(png[1:4]) != "PNG" {
		t.Fatalf("screenshot %s: %v (%d bytes)", shot, err, len(png))
	}
	t.Logf("screenshot: %s", shot)
	if update {
		if err := os.WriteFile(filepath.Join(docs, "ui.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// secondEnds returns once the current wall-clock second has ended: the
// live page shows completed seconds only (insight.Snapshot), so counts
// made in this second appear after it.
func secondEnds() {
	now := time.Now()
	time.Sleep(now.Truncate(time.Second).Add(time.Second + 20*time.Millisecond).Sub(now))
}

// Attack: a key that is markup, shown on the live page. A client of the
// decision API (or any client, through a header a rule keys on) picks
// its key; were the page to insert keys as HTML, an operator opening it
// would run the client's script with the operator's session. In a real
// browser the key is drawn as text: the document holds no element the
// key would have made, and the script did not run.
func TestAttackUIMarkupKeyInBrowser(t *testing.T) {
	bin := testbin.Find(t, "chromium", "/usr/bin/chromium")
	addr := startUIServe(t)
	const evil = `<img src=x onerror="document.title='pwned'">`
	for range 3 {
		resp, err := http.Post("http://"+addr+"/v1/take", "application/json", strings.NewReader(`{"rule":"per-user","key":"`+strings.ReplaceAll(evil, `"`, `\"`)+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("take: %d", resp.StatusCode)
		}
	}
	dom := chromium(t, bin, addr, "--dump-dom")
	if !strings.Contains(dom, `data-state="ok"`) {
		t.Fatalf("the page's script did not draw the data:\n%s", dom)
	}
	if !strings.Contains(dom, `>&lt;img src=x onerror="document.title='pwned'"&gt;</td>`) {
		t.Errorf("the key is not shown as text:\n%s", dom)
	}
	if strings.Contains(dom, "<img") || strings.Contains(dom, "pwned</title>") || !strings.Contains(dom, "<title>sluice · live</title>") {
		t.Errorf("the key became markup:\n%s", dom)
	}
}

// TestUIFleetInBrowser: two processes of a fleet on one Redis, traffic
// through each, and the page of the first opened in Chromium: it lists
// both processes, each with its own requests, and shows the fleet's
// totals, the key driven through the second process among the hottest,
// and the sparklines' scales.
func TestUIFleetInBrowser(t *testing.T) {
	bin := testbin.Find(t, "chromium", "/usr/bin/chromium")
	addr := redistest.Server(t)
	t.Setenv("SLUICE_UI_TEST_ADMIN_TOKEN", uiTestToken)
	t.Chdir(t.TempDir())
	conf := fmt.Sprintf("store:\n  url: redis://%s/0?timeout=10s&dial_timeout=30s&write_timeout=30s\n%s", addr, uiTestPolicy)
	if err := os.WriteFile("policy.yaml", []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p1, _ := startServe(t, "--config", "policy.yaml")
	p2, _ := startServe(t, "--config", "policy.yaml")
	// per-user: 10 an hour, one bucket per user in Redis, whichever
	// process asks.
	if n := drive(t, p1.API, "user-a", 3); n != 3 {
		t.Errorf("user-a: %d of 3 admitted", n)
	}
	if n := drive(t, p2.API, "hot-user", 30); n != 10 {
		t.Errorf("hot-user: %d of 30 admitted through the second process, want 10", n)
	}
	// Each process publishes its statistics once a second: wait (a
	// bounded number of reads) until the first one's page counts all 33
	// requests, 20 of them rejected, of both processes.
	var st struct {
		Requests struct{ Admitted, Rejected []int }
		Fleet    struct {
			Self      string
			Processes []struct {
				ID                 string
				Admitted, Rejected int
				Live               bool
			}
		}
	}
	self2 := ""
	for i := 0; ; i++ {
		secondEnds()
		if self2 == "" {
			self2 = statsOf(t, p2.API, &st).Fleet.Self
		}
		statsOf(t, p1.API, &st)
		a, r := total(st.Requests.Admitted), total(st.Requests.Rejected)
		if a == 13 && r == 20 && len(st.Fleet.Processes) == 2 {
			break
		}
		if i == 60 {
			t.Fatalf("the first process's page counts %d admitted and %d rejected requests, want 13 and 20: %+v", a, r, st.Fleet)
		}
	}
	self1 := st.Fleet.Self
	if self1 == self2 {
		t.Fatalf("both processes are %s", self1)
	}

	dom := chromium(t, bin, p1.API, "--dump-dom")
	if !strings.Contains(dom, `data-state="ok"`) {
		t.Fatalf("the page's script did not draw the data:\n%s", dom)
	}
	for id, want := range map[string][2]int{self1: {3, 0}, self2: {10, 20}} {
		re := regexp.MustCompile(`<tr data-process="` + regexp.QuoteMeta(id) + `" data-state="live">[\s\S]*?data-admitted="(\d+)"[\s\S]*?data-rejected="(\d+)"`)
		m := re.FindStringSubmatch(dom)
		if m == nil {
			t.Errorf("the page does not list process %s as live:\n%s", id, dom)
			continue
		}
		if m[1] != strconv.Itoa(want[0]) || m[2] != strconv.Itoa(want[1]) {
			t.Errorf("process %s: %s admitted, %s rejected; want %v", id, m[1], m[2], want)
		}
	}
	if !strings.Contains(dom, `data-requests="admitted" data-value="13"`) || !strings.Contains(dom, `data-requests="rejected" data-value="20"`) {
		t.Errorf("the page does not show the fleet's 13 admitted and 20 rejected requests:\n%s", dom)
	}
	if !regexp.MustCompile(`<tr data-hot="rejections"><td class="key" title="hot-user">hot-user</td>`).MatchString(dom) {
		t.Errorf("hot-user, driven through the second process, is not in the first's rejections ranking:\n%s", dom)
	}
	if got := ruleTotal(t, dom, "per-user", "rejected"); got != 20 {
		t.Errorf("per-user: %d rejected on the fleet's page, want 20", got)
	}
	if !strings.Contains(dom, `data-axis="max"`) || !strings.Contains(dom, `data-axis="min" data-value="0">0</span>`) {
		t.Errorf("the charts have no scales:\n%s", dom)
	}
}

// statsOf reads /v1/stats of the server at addr into v.
func statsOf[T any](t *testing.T, addr string, v *T) *T {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/stats", nil)
	req.Header.Set("Authorization", "Bearer "+uiTestToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/v1/stats: %d %v", resp.StatusCode, err)
	}
	return v
}

func total(xs []int) (n int) {
	for _, x := range xs {
		n += x
	}
	return n
}
