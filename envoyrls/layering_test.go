package envoyrls_test

import (
	"go/build"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/sluicehq/sluice"

// deps is `go list -deps` of a package of this module, read with go/build:
// every package of the module it imports, directly or not (test files
// aside).
func deps(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	var walk func(path string)
	walk = func(path string) {
		if seen[path] || (path != module && !strings.HasPrefix(path, module+"/")) {
			return
		}
		seen[path] = true
		dir := filepath.Join("..", filepath.FromSlash(strings.TrimPrefix(path, module)))
		p, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, imp := range p.Imports {
			walk(imp)
		}
	}
	walk(module + "/" + pkg)
	return seen
}

// Each transport turns a policy.Verdict into its own wire format with
// what package policy says a client is told; neither leans on the other,
// and the shared pieces (policy, metrics) lean on no transport.
func TestTransportsImportNoTransport(t *testing.T) {
	for pkg, banned := range map[string][]string{
		"envoyrls": {"httpgate"},
		"httpgate": {"envoyrls"},
		"policy":   {"httpgate", "envoyrls", "metrics"},
		"metrics":  {"httpgate", "envoyrls"},
	} {
		d := deps(t, pkg)
		for _, b := range banned {
			if d[module+"/"+b] {
				t.Errorf("%s imports %s (directly or through another package)", pkg, b)
			}
		}
	}
}
