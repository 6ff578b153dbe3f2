// Package testbin finds the programs integration tests start (nginx,
// Caddy, Chromium): on the PATH, or where Debian's package puts them.
package testbin

import (
	"os"
	"os/exec"
	"testing"

	"github.com/sluicehq/sluice/internal/realserver"
)

// Find returns the path of the program name, or debianPath when it is
// not on the PATH. When it is missing the test is skipped, except under
// CI=true, where that is a failure: CI must run every test.
func Find(t testing.TB, name, debianPath string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if _, err := os.Stat(debianPath); err == nil {
		return debianPath
	}
	realserver.Missing(t, name, name, "")
	return ""
}
