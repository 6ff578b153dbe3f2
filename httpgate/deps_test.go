package httpgate_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A program that uses the middleware alone does not link Prometheus
// (about a third of a small program's binary): Options.Metrics is an
// interface that package metrics implements.
func TestHTTPGateDoesNotImportPrometheus(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list the package's dependencies")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "prometheus") {
			t.Errorf("httpgate depends on %s", dep)
		}
	}
}
