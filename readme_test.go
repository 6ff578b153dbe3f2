package sluice_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// docPages is README.md and every page of docs/, the documentation the
// tests below hold to the code and to itself.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 10 {
		t.Fatalf("found %d pages in docs/: the glob is broken", len(pages))
	}
	return append([]string{"README.md"}, pages...)
}

// Every Go snippet of README.md and docs/ is an excerpt of an example
// test, so that it compiles and, where it needs no server, runs with its
// output checked: its lines, trimmed and without the blank ones, appear
// in that order in one example*_test.go file of the module.
func TestReadmeSnippetsAreExamples(t *testing.T) {
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
	n := 0
	for _, page := range docPages(t) {
		md, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(md), "\n")
		for _, sn := range goSnippets(string(md)) {
			n++
			// A block right after "<!-- examples/... -->" is a whole file
			// of the module, compiled and run as itself; the recipes'
			// test holds the page to the file.
			if sn.line >= 3 && strings.HasPrefix(lines[sn.line-3], "<!-- examples/") {
				continue
			}
			want := codeLines(sn.code)
			found := false
			for _, have := range examples {
				if inOrder(want, have) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s:%d: this Go snippet is in no example test; put it in an Example function of an example*_test.go file:\n%s", page, sn.line, sn.code)
			}
		}
	}
	if n < 10 {
		t.Errorf("found %d Go snippets in the documentation: the reading of the pages is broken", n)
	}
}

type snippet struct {
	line int
	code string
}

// goSnippets returns a page's ```go blocks with the line each starts on.
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

// TestDocLinksResolve: every relative link of README.md and docs/ names a
// file or folder that exists, and every #fragment a heading of the page
// it points into, as GitHub renders it; every page of docs/ opens with
// its contents, which link each of its ## and ### headings; and no topic
// is a bold run-in paragraph ("**Topic.** text"), which nothing can link.
func TestDocLinksResolve(t *testing.T) {
	headings := map[string]map[string]bool{}
	anchorsOf := func(page string) map[string]bool {
		if a, ok := headings[page]; ok {
			return a
		}
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		a := map[string]bool{}
		for _, h := range mdHeadings(string(data)) {
			a[h.anchor] = true
		}
		headings[page] = a
		return a
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	runIn := regexp.MustCompile(`^\*\*[^*]+[.:]\*\* `)
	for _, page := range docPages(t) {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		for i, line := range proseLines(text) {
			if line == "" {
				continue
			}
			if runIn.MatchString(line) {
				t.Errorf("%s:%d: a bold run-in topic; make it a heading: %s", page, i+1, line)
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, frag, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
					if _, err := os.Stat(path); err != nil {
						t.Errorf("%s:%d: links %s, which does not exist", page, i+1, target)
						continue
					}
				}
				if frag != "" {
					if !strings.HasSuffix(path, ".md") {
						t.Errorf("%s:%d: links %s: a fragment of a file that is no page", page, i+1, target)
					} else if !anchorsOf(path)[frag] {
						t.Errorf("%s:%d: links %s, but %s has no heading #%s", page, i+1, target, path, frag)
					}
				}
			}
		}
		if page == "README.md" {
			continue
		}
		hs := mdHeadings(text)
		if len(hs) == 0 || !strings.Contains(text, "Contents") {
			t.Errorf("%s has no contents", page)
			continue
		}
		for _, h := range hs {
			if h.level >= 2 && h.level <= 3 && h.text != "Contents" && !strings.Contains(text, "](#"+h.anchor+")") {
				t.Errorf("%s: the contents do not link %q (#%s)", page, h.text, h.anchor)
			}
		}
	}
}

type heading struct {
	level        int
	text, anchor string
}

// mdHeadings returns a page's ATX headings outside fenced blocks, each
// with the fragment GitHub gives it: lower-cased, punctuation but hyphens
// and underscores dropped, spaces as hyphens, and -1, -2, ... after a
// fragment the page has already given.
func mdHeadings(md string) []heading {
	var out []heading
	seen := map[string]int{}
	for _, line := range proseLines(md) {
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if level == 0 || level > 6 || !strings.HasPrefix(line[level:], " ") {
			continue
		}
		text := strings.TrimSpace(line[level:])
		a := githubAnchor(text)
		if n := seen[a]; n > 0 {
			seen[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out = append(out, heading{level, text, a})
	}
	return out
}

// githubAnchor is the fragment GitHub gives a heading's text.
func githubAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && unicode.IsLetter(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// proseLines is a page's lines with those of fenced blocks and the
// fences themselves blanked, so that code is never read as a heading or
// a link.
func proseLines(md string) []string {
	lines := strings.Split(md, "\n")
	fenced := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			lines[i] = ""
		} else if fenced {
			lines[i] = ""
		}
	}
	return lines
}
