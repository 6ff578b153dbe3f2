package sluice_test

import (
	"go/build"
	"path/filepath"
	"strings"
	"testing"
)

const modulePath = "github.com/sluicehq/sluice"

// moduleImports is every import of pkg (a directory of this module, "."
// for the root) and of the module's packages it imports, directly or
// not, test files aside.
func moduleImports(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	imports := map[string]bool{}
	var walk func(dir string)
	walk = func(dir string) {
		if seen[dir] {
			return
		}
		seen[dir] = true
		p, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		for _, imp := range p.Imports {
			imports[imp] = true
			if imp == modulePath || strings.HasPrefix(imp, modulePath+"/") {
				walk(filepath.FromSlash("." + strings.TrimPrefix(imp, modulePath)))
			}
		}
	}
	walk(filepath.FromSlash(pkg))
	return imports
}

// The stores that talk to a server count their events through an
// observer that package metrics implements: a program that uses a store
// without Prometheus does not link it, and metrics wrap stores from
// outside.
func TestStoresDoNotImportPrometheus(t *testing.T) {
	for _, pkg := range []string{"redis", "postgres"} {
		for imp := range moduleImports(t, "./"+pkg) {
			if strings.HasPrefix(imp, "github.com/prometheus/") {
				t.Errorf("%s imports %s (directly or through a package of the module)", pkg, imp)
			}
		}
	}
}
