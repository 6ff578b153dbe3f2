package main

import (
	"strings"
	"testing"
	"time"
)

// passing is go test -json output, an event a line. The test runs in its
// package's directory, which has no go.mod: package names show in full.
const passing = `{"Action":"start","Package":"m/a"}
{"Action":"run","Package":"m/a","Test":"TestOK"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"m/a","Test":"TestOK","Elapsed":0}
{"Action":"run","Package":"m/a","Test":"TestRedis"}
{"Action":"output","Package":"m/a","Test":"TestRedis","Output":"=== RUN   TestRedis\n"}
{"Action":"output","Package":"m/a","Test":"TestRedis","Output":"    server_test.go:37: redis-server not found: install it (apt-get install redis-server) or set SLUICE_REDIS_URL\n"}
{"Action":"output","Package":"m/a","Test":"TestRedis","Output":"--- SKIP: TestRedis (0.00s)\n"}
{"Action":"skip","Package":"m/a","Test":"TestRedis","Elapsed":0}
{"Action":"run","Package":"m/a","Test":"TestNginx"}
{"Action":"output","Package":"m/a","Test":"TestNginx","Output":"=== RUN   TestNginx\n"}
{"Action":"output","Package":"m/a","Test":"TestNginx","Output":"    helpers_test.go:9: starting\n"}
{"Action":"output","Package":"m/a","Test":"TestNginx","Output":"    helpers_test.go:31: nginx not found: install it\n"}
{"Action":"output","Package":"m/a","Test":"TestNginx","Output":"        (apt-get install nginx)\n"}
{"Action":"output","Package":"m/a","Test":"TestNginx","Output":"--- SKIP: TestNginx (0.00s)\n"}
{"Action":"skip","Package":"m/a","Test":"TestNginx","Elapsed":0}
{"Action":"output","Package":"m/a","Output":"PASS\n"}
{"Action":"output","Package":"m/a","Output":"ok  \tm/a\t0.012s\n"}
{"Action":"pass","Package":"m/a","Elapsed":0.012}
{"Action":"output","Package":"m/b","Output":"?   \tm/b\t[no test files]\n"}
{"Action":"skip","Package":"m/b","Elapsed":0}
`

func reportOf(t *testing.T, in string) (string, int) {
	t.Helper()
	var out strings.Builder
	code := run(strings.NewReader(in), &out, time.Now())
	return out.String(), code
}

// A passing run names every skipped test with the reason it gave, and
// exits 0.
func TestPassingRunListsSkips(t *testing.T) {
	out, code := reportOf(t, passing)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"ok    m/a ", "(1 passed, 2 skipped)",
		"--    m/b ", "(no test files)",
		"Skipped (2):\n",
		"  redis-server not found: install it (apt-get install redis-server) or set SLUICE_REDIS_URL\n      m/a TestRedis\n",
		"  nginx not found: install it (apt-get install nginx)\n      m/a TestNginx\n",
		"\nPASS\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
}

// A failed subtest shows in full under its test, in the order it ran; a
// build failure shows its compiler output; either exits 1.
func TestFailuresInFull(t *testing.T) {
	in := `{"Action":"run","Package":"m/a","Test":"TestX"}
{"Action":"output","Package":"m/a","Test":"TestX","Output":"=== RUN   TestX\n"}
{"Action":"run","Package":"m/a","Test":"TestX/sub"}
{"Action":"output","Package":"m/a","Test":"TestX/sub","Output":"=== RUN   TestX/sub\n"}
{"Action":"output","Package":"m/a","Test":"TestX/sub","Output":"    a_test.go:10: the fleet admitted 8\n"}
{"Action":"output","Package":"m/a","Test":"TestX/sub","Output":"--- FAIL: TestX/sub (0.00s)\n"}
{"Action":"fail","Package":"m/a","Test":"TestX/sub","Elapsed":0}
{"Action":"output","Package":"m/a","Test":"TestX","Output":"--- FAIL: TestX (0.00s)\n"}
{"Action":"fail","Package":"m/a","Test":"TestX","Elapsed":0}
{"Action":"output","Package":"m/a","Output":"FAIL\n"}
{"Action":"fail","Package":"m/a","Elapsed":0.1}
{"ImportPath":"m/c [m/c.test]","Action":"build-output","Output":"# m/c [m/c.test]\n"}
{"ImportPath":"m/c [m/c.test]","Action":"build-output","Output":"c/c_test.go:5:28: undefined: x\n"}
{"ImportPath":"m/c [m/c.test]","Action":"build-fail"}
{"Action":"start","Package":"m/c"}
{"Action":"output","Package":"m/c","Output":"FAIL\tm/c [build failed]\n"}
{"Action":"fail","Package":"m/c","Elapsed":0,"FailedBuild":"m/c [m/c.test]"}
`
	out, code := reportOf(t, in)
	if code != 1 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"FAIL  m/a ", "(0 passed, 2 failed)",
		"FAIL  m/c ", "(build failed)",
		"=== FAIL: m/a TestX\n=== RUN   TestX\n=== RUN   TestX/sub\n    a_test.go:10: the fleet admitted 8\n--- FAIL: TestX/sub (0.00s)\n--- FAIL: TestX (0.00s)\n",
		"=== BUILD FAILED: m/c [m/c.test]\n# m/c [m/c.test]\nc/c_test.go:5:28: undefined: x\n",
		"\nFAIL\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
}

// A test binary that dies in a test (a timeout's panic) leaves the test
// unfinished: its output is shown. No input at all is a failure too.
func TestUnfinishedAndEmpty(t *testing.T) {
	in := `{"Action":"run","Package":"m/a","Test":"TestHang"}
{"Action":"output","Package":"m/a","Test":"TestHang","Output":"=== RUN   TestHang\n"}
{"Action":"output","Package":"m/a","Output":"panic: test timed out after 10m0s\n"}
{"Action":"fail","Package":"m/a","Elapsed":600}
`
	out, code := reportOf(t, in)
	if code != 1 || !strings.Contains(out, "=== UNFINISHED: m/a TestHang\n=== RUN   TestHang\n") || !strings.Contains(out, "panic: test timed out after 10m0s\n") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if out, code := reportOf(t, "go: cannot find main module\n"); code != 1 || !strings.Contains(out, "go: cannot find main module\n") || !strings.Contains(out, "no test results read") {
		t.Fatalf("no events: exit %d:\n%s", code, out)
	}
}
