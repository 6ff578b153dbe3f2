package sluice_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// headingAnchors returns the anchors GitHub gives the headings of the
// markdown file at path: lower case, punctuation dropped, spaces as
// hyphens, a repeated one suffixed -1, -2, ...
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, h := range mdHeadings(string(b)) {
		anchors[h.anchor] = true
	}
	return anchors
}

// benchCitation is a Go comment's mention of the benchmark pages: the
// former notebook, bench/README.md, or a dated run, with its anchor.
var benchCitation = regexp.MustCompile(`(BENCHMARKS\.md|bench/README\.md|bench/results/[\w.-]+\.md)(#[\w-]+)?`)

// Go comments name benchmarks and link the benchmark pages, never the
// old notebook: every link to bench/README.md or a dated run under
// bench/results names a file and, with #anchor, a heading that exists.
func TestBenchmarkCitationsResolve(t *testing.T) {
	anchors := map[string]map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil || !benchCitation.Match(src) {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				for _, m := range benchCitation.FindAllStringSubmatch(c.Text, -1) {
					where := fset.Position(c.Pos())
					file, anchor := m[1], strings.TrimPrefix(m[2], "#")
					if file == "BENCHMARKS.md" {
						t.Errorf("%s cites BENCHMARKS.md: name the benchmark, and link bench/README.md or bench/results/DAY.md", where)
						continue
					}
					if _, err := os.Stat(file); err != nil {
						t.Errorf("%s cites %s, which does not exist", where, file)
						continue
					}
					if anchor == "" {
						continue
					}
					if anchors[file] == nil {
						anchors[file] = headingAnchors(t, file)
					}
					if !anchors[file][anchor] {
						t.Errorf("%s cites %s#%s: %s has no such heading", where, file, anchor, file)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The links of the benchmark pages, to their own headings and to each
// other's, land on a heading (the docs pages' are TestDocLinksResolve's).
func TestBenchmarkPageLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]*)\)`)
	for _, page := range []string{"bench/README.md", "BENCHMARKS.md"} {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			if file == "" {
				file = page
			} else {
				file = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s links %s: %v", page, target, err)
				continue
			}
			if anchor != "" && !headingAnchors(t, file)[anchor] {
				t.Errorf("%s links %s: %s has no such heading", page, target, file)
			}
		}
	}
}
