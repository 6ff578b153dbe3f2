package policy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// loaderFields are the field names the loader accepts, read from its own
// source: every string of a package-level variable named ...Fields, and of
// a list passed straight to object, the function that refuses the fields
// a mapping does not allow. A field added there is in this set at once.
func loaderFields(t *testing.T) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	strs := func(n ast.Node) {
		ast.Inspect(n, func(n ast.Node) bool {
			if bl, ok := n.(*ast.BasicLit); ok && bl.Kind == token.STRING {
				if s, err := strconv.Unquote(bl.Value); err == nil {
					out[s] = true
				}
			}
			return true
		})
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if strings.HasSuffix(id.Name, "Fields") && i < len(n.Values) {
						if _, ok := n.Values[i].(*ast.CompositeLit); ok {
							strs(n.Values[i])
						}
					}
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "object" && len(n.Args) == 3 {
					if cl, ok := n.Args[2].(*ast.CompositeLit); ok {
						strs(cl)
					}
				}
			}
			return true
		})
	}
	if len(out) < 50 {
		t.Fatalf("found %d fields in the loader: the reading of its source is broken", len(out))
	}
	return out
}

// docRow is a row of docs/configuration.md's reference: | `path.field` | ...
var docRow = regexp.MustCompile("(?m)^\\| `([a-z0-9_.\\[\\]]+)` \\|")

// TestConfigurationReference: every field the loader accepts has an entry
// in docs/configuration.md, and every entry there is a field the loader
// accepts.
func TestConfigurationReference(t *testing.T) {
	data, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	accepted := loaderFields(t)
	documented := map[string]bool{}
	for _, m := range docRow.FindAllStringSubmatch(string(data), -1) {
		parts := strings.Split(m[1], ".")
		name := strings.TrimSuffix(parts[len(parts)-1], "[]")
		documented[name] = true
		if !accepted[name] {
			t.Errorf("docs/configuration.md documents %s, which the loader does not accept", m[1])
		}
	}
	var missing []string
	for f := range accepted {
		if !documented[f] {
			missing = append(missing, f)
		}
	}
	slices.Sort(missing)
	for _, f := range missing {
		t.Errorf("the loader accepts %q, which docs/configuration.md does not document (add a row | `section.%s` | type | default | meaning |)", f, f)
	}
}
