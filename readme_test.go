package sluice_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every Go snippet of README.md is an excerpt of an example test, so that
// it compiles and, where it needs no server, runs with its output checked:
// its lines, trimmed and without the blank ones, appear in that order in
// one example*_test.go file of the module.
func TestReadmeSnippetsAreExamples(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, pattern := range []string{"example*_test.go", "*/example*_test.go"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	examples := map[string][]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		examples[f] = codeLines(string(data))
	}
	for _, sn := range goSnippets(string(readme)) {
		want := codeLines(sn.code)
		found := false
		for _, have := range examples {
			if inOrder(want, have) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("README.md:%d: this Go snippet is in no example test; put it in an Example function of an example*_test.go file:\n%s", sn.line, sn.code)
		}
	}
}

type snippet struct {
	line int
	code string
}

// goSnippets returns README's ```go blocks with the line each starts on.
func goSnippets(md string) []snippet {
	var out []snippet
	var cur *snippet
	var b strings.Builder
	for i, l := range strings.Split(md, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(l) == "```go":
			cur = &snippet{line: i + 2}
			b.Reset()
		case cur != nil && strings.TrimSpace(l) == "```":
			cur.code = b.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			b.WriteString(l + "\n")
		}
	}
	return out
}

// codeLines is src's lines, trimmed, without the blank ones.
func codeLines(src string) []string {
	var out []string
	for _, l := range strings.Split(src, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// inOrder reports whether want's lines appear in have in that order, the
// first of them anywhere.
func inOrder(want, have []string) bool {
	for start := range have {
		if have[start] != want[0] {
			continue
		}
		i := 0
		for _, l := range have[start:] {
			if i < len(want) && l == want[i] {
				i++
			}
		}
		if i == len(want) {
			return true
		}
	}
	return false
}
