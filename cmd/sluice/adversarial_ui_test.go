package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testbin"
)

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
