// Command testreport reads `go test -json` on its standard input and
// reports what plain `go test` leaves out of a passing run: it prints one
// line per package as each ends, then every skipped test with the reason
// it gave (a real server the machine lacks, for instance), then the whole
// output of every failed test and of every package that failed to build
// or run. It exits 1 when anything failed, or when it read no results.
//
//	go test -race -count=1 -json ./... | go run ./internal/testreport
//
// A line of input that is not a JSON event is copied through unchanged.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent, and the
// build events go test interleaves since Go 1.24).
type event struct {
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
	ImportPath  string // build-output and build-fail
}

// test is one test's (or subtest's) output and outcome.
type test struct {
	name   string
	output strings.Builder
	result string // pass, fail, skip; empty while running
}

// chunk is a piece of a test's output, kept in the order the package
// printed it, so that a failed test shows with its subtests interleaved
// as go test -v shows them.
type chunk struct {
	test *test
	out  string
}

// pkg is one package's tests, in the order they started.
type pkg struct {
	name   string
	tests  map[string]*test
	order  []*test
	chunks []chunk
	// The package's own output: a panic outside a test, a failing
	// TestMain, the final ok or FAIL line.
	output strings.Builder
	result string

	passed, failed, skipped int
}

type report struct {
	out      io.Writer
	pkgs     map[string]*pkg
	order    []*pkg
	builds   map[string]*strings.Builder // build output by import path
	buildBad []string                    // import paths whose build failed
	width    int                         // of the package column
	mod      *string                     // see module
}

func main() {
	os.Exit(run(os.Stdin, os.Stdout, time.Now()))
}

// run reads events from in, reports on out and returns the exit code.
func run(in io.Reader, out io.Writer, start time.Time) int {
	r := &report{out: out, pkgs: map[string]*pkg{}, builds: map[string]*strings.Builder{}, width: 24}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<16), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		r.add(e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testreport: reading the test output: %v\n", err)
		return 1
	}
	return r.finish(time.Since(start))
}

func (r *report) pkg(name string) *pkg {
	p := r.pkgs[name]
	if p == nil {
		p = &pkg{name: name, tests: map[string]*test{}}
		r.pkgs[name] = p
		r.order = append(r.order, p)
	}
	return p
}

func (p *pkg) test(name string) *test {
	t := p.tests[name]
	if t == nil {
		t = &test{name: name}
		p.tests[name] = t
		p.order = append(p.order, t)
	}
	return t
}

func (r *report) add(e event) {
	switch e.Action {
	case "build-output":
		b := r.builds[e.ImportPath]
		if b == nil {
			b = new(strings.Builder)
			r.builds[e.ImportPath] = b
		}
		b.WriteString(e.Output)
		return
	case "build-fail":
		r.buildBad = append(r.buildBad, e.ImportPath)
		return
	}
	if e.Package == "" {
		return
	}
	p := r.pkg(e.Package)
	if e.Test == "" {
		switch e.Action {
		case "output":
			p.output.WriteString(e.Output)
		case "pass", "fail", "skip":
			p.result = e.Action
			if e.FailedBuild != "" {
				p.result = "build failed"
			}
			r.line(p, e.Elapsed)
		}
		return
	}
	t := p.test(e.Test)
	switch e.Action {
	case "output":
		t.output.WriteString(e.Output)
		p.chunks = append(p.chunks, chunk{t, e.Output})
	case "pass", "fail", "skip":
		t.result = e.Action
		switch e.Action {
		case "pass":
			p.passed++
		case "fail":
			p.failed++
		case "skip":
			p.skipped++
		}
	}
}

// line prints a package's outcome as it ends.
func (r *report) line(p *pkg, elapsed float64) {
	name := r.name(p.name)
	var detail string
	switch {
	case p.result == "skip":
		fmt.Fprintf(r.out, "--    %-*s          (no test files)\n", r.width, name)
		return
	case p.result == "pass" && p.passed+p.skipped+p.failed == 0:
		fmt.Fprintf(r.out, "--    %-*s          (no tests to run)\n", r.width, name)
		return
	case p.result == "build failed":
		fmt.Fprintf(r.out, "FAIL  %-*s          (build failed)\n", r.width, name)
		return
	}
	detail = fmt.Sprintf("%d passed", p.passed)
	if p.skipped > 0 {
		detail += fmt.Sprintf(", %d skipped", p.skipped)
	}
	if p.failed > 0 {
		detail += fmt.Sprintf(", %d failed", p.failed)
	}
	status := "ok  "
	if p.result == "fail" {
		status = "FAIL"
	}
	fmt.Fprintf(r.out, "%s  %-*s %6.1fs  (%s)\n", status, r.width, name, elapsed, detail)
}

// module is the path package names are shown relative to: the module
// of go.mod in the working directory, where go test ./... runs.
func (r *report) module() string {
	if r.mod == nil {
		mod := ""
		if data, err := os.ReadFile("go.mod"); err == nil {
			for _, l := range strings.Split(string(data), "\n") {
				if f := strings.Fields(l); len(f) == 2 && f[0] == "module" {
					mod = strings.Trim(f[1], `"`)
				}
			}
		}
		r.mod = &mod
	}
	return *r.mod
}

// name is a package's path relative to the module.
func (r *report) name(path string) string {
	switch mod := r.module(); {
	case mod == "":
		return path
	case path == mod:
		return "."
	default:
		return strings.TrimPrefix(path, mod+"/")
	}
}

// fileLine is the position go test puts before a logged line.
var fileLine = regexp.MustCompile(`^\s*[\w.-]+\.go:\d+: `)

// skipReason is what a skipped test said last before it skipped.
func skipReason(out string) string {
	var reason string
	for _, l := range strings.Split(out, "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		if fileLine.MatchString(l) {
			reason = fileLine.ReplaceAllString(l, "")
		} else if reason != "" {
			reason += " " + t // a continuation of a message of several lines
		} else {
			reason = t
		}
	}
	if reason == "" {
		return "(no reason given)"
	}
	return reason
}

// finish prints the skipped tests, the failures and a summary, and
// returns the exit code.
func (r *report) finish(elapsed time.Duration) int {
	var passed, failed, skipped, pkgsFailed int
	type skip struct{ pkg, test string }
	byReason := map[string][]skip{}
	for _, p := range r.order {
		passed += p.passed
		failed += p.failed
		skipped += p.skipped
		if p.result != "pass" && p.result != "skip" {
			pkgsFailed++
		}
		for _, t := range p.order {
			if t.result == "skip" {
				reason := skipReason(t.output.String())
				byReason[reason] = append(byReason[reason], skip{r.name(p.name), t.name})
			}
		}
	}
	if len(byReason) > 0 {
		reasons := slices.SortedFunc(maps.Keys(byReason), func(a, b string) int {
			return cmp.Or(cmp.Compare(len(byReason[b]), len(byReason[a])), cmp.Compare(a, b))
		})
		fmt.Fprintf(r.out, "\nSkipped (%d):\n", skipped)
		for _, reason := range reasons {
			fmt.Fprintf(r.out, "  %s\n", reason)
			for _, s := range byReason[reason] {
				fmt.Fprintf(r.out, "      %s %s\n", s.pkg, s.test)
			}
		}
	}

	// Failures in full: a failed test's output with its subtests', and the
	// package's own output when the package failed outside its tests.
	for _, path := range r.buildBad {
		fmt.Fprintf(r.out, "\n=== BUILD FAILED: %s\n%s", path, r.builds[path])
	}
	for _, p := range r.order {
		if p.result == "pass" || p.result == "skip" || p.result == "build failed" {
			continue
		}
		shown := false
		for _, t := range p.order {
			if t.result == "fail" && !strings.Contains(t.name, "/") {
				fmt.Fprintf(r.out, "\n=== FAIL: %s %s\n", p.name, t.name)
				for _, c := range p.chunks {
					if c.test == t || strings.HasPrefix(c.test.name, t.name+"/") {
						io.WriteString(r.out, c.out)
					}
				}
				shown = true
			}
			if t.result == "" {
				// Still running when the binary ended: a panic, a timeout
				// or os.Exit. Its output says where.
				fmt.Fprintf(r.out, "\n=== UNFINISHED: %s %s\n%s", p.name, t.name, t.output.String())
				shown = true
			}
		}
		if out := ownOutput(p.output.String()); out != "" || !shown {
			fmt.Fprintf(r.out, "\n=== FAIL: %s\n%s", p.name, out)
		}
	}
	for _, p := range r.order {
		if p.result == "" {
			pkgsFailed++
			fmt.Fprintf(r.out, "\n=== NO RESULT: %s (the input ended before the package did)\n%s", p.name, p.output.String())
		}
	}

	fmt.Fprintf(r.out, "\n%d packages, %d tests: %d passed, %d skipped, %d failed; %s\n",
		len(r.order), passed+failed+skipped, passed, skipped, failed, elapsed.Round(time.Second))
	switch {
	case len(r.order) == 0 && len(r.buildBad) == 0:
		fmt.Fprintln(r.out, "FAIL: no test results read (run go test with -json and pipe it in)")
		return 1
	case failed > 0 || pkgsFailed > 0 || len(r.buildBad) > 0:
		fmt.Fprintln(r.out, "FAIL")
		return 1
	}
	fmt.Fprintln(r.out, "PASS")
	return 0
}

// ownOutput is a package's output less the lines go test ends every
// package with: what a panic outside a test, a failing TestMain or a
// test binary that exited early printed.
func ownOutput(out string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(out, "\n") {
		t := strings.TrimSpace(l)
		if t == "" || t == "FAIL" || t == "PASS" || strings.HasPrefix(t, "FAIL\t") || strings.HasPrefix(t, "ok \t") || strings.HasPrefix(t, "exit status ") {
			continue
		}
		b.WriteString(l)
	}
	return b.String()
}
