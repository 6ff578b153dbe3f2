package sluice_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Shape limits: a file a reader can hold in mind, a function that fits on
// a screen or two.
const (
	maxFileLines = 800 // non-test files
	maxFuncLines = 120 // every file, tests included
)

// longFuncs are the functions still over maxFuncLines, by file and name
// ("Type.Method" for a method). Each is to be split; an entry whose
// function has been split must go.
var longFuncs = map[string]bool{}

// TestShapeLimits walks the module's Go files (the bench module aside)
// and fails on a non-test file over maxFileLines or a function over
// maxFuncLines that longFuncs does not name. It logs the module's
// non-test line count, the figure a restructuring states before and after.
func TestShapeLimits(t *testing.T) {
	fset := token.NewFileSet()
	var nonTest int
	seen := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == "." {
				return nil
			}
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module (bench)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(path)
		lines := bytes.Count(src, []byte("\n"))
		if !strings.HasSuffix(path, "_test.go") {
			nonTest += lines
			if lines > maxFileLines {
				t.Errorf("%s: %d lines, over %d: split it by concern", rel, lines, maxFileLines)
			}
		}
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if n <= maxFuncLines {
				continue
			}
			name := rel + " " + funcName(fn)
			seen[name] = true
			if !longFuncs[name] {
				t.Errorf("%s: %d lines, over %d: split it into named steps", name, n, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range longFuncs {
		if !seen[name] {
			t.Errorf("%s is no longer over %d lines (or is gone): remove it from longFuncs", name, maxFuncLines)
		}
	}
	t.Logf("non-test Go lines of the module: %d", nonTest)
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr:
			typ = x.X
			continue
		case *ast.IndexListExpr:
			typ = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fn.Name.Name
		}
		return fmt.Sprintf("%T.%s", typ, fn.Name.Name)
	}
}
