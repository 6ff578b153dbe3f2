package sluice_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/doc"
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

// maxRootPage bounds the root package's page: what an application uses,
// as `go doc -short .` lists it, one line per declaration (a const or
// var group, a type, a function, a type's constructors and its consts).
// The arithmetic a store implements lives in engine.
const maxRootPage = 35

// TestRootPageFits counts the lines `go doc -short .` prints for the
// root package, from go/doc as that command computes them.
func TestRootPageFits(t *testing.T) {
	fset := token.NewFileSet()
	var files []*ast.File
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/sluicehq/sluice")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, v := range append(p.Consts, p.Vars...) {
		lines = append(lines, strings.Join(v.Names, ", "))
	}
	for _, f := range p.Funcs {
		lines = append(lines, f.Name)
	}
	for _, ty := range p.Types {
		lines = append(lines, ty.Name)
		for _, v := range append(ty.Consts, ty.Vars...) {
			lines = append(lines, strings.Join(v.Names, ", "))
		}
		for _, f := range ty.Funcs {
			lines = append(lines, f.Name)
		}
	}
	if len(lines) > maxRootPage {
		t.Errorf("go doc -short . is %d lines, more than %d: %s", len(lines), maxRootPage, strings.Join(lines, "; "))
	}
	t.Logf("root page: %d lines", len(lines))
}
