// Package realserver says what a test does when a real server it needs
// (redis-server, PostgreSQL, nginx, Caddy) is not there: on a developer's
// machine it skips, saying what is missing and how to provide it; under
// CI=true, where every server must be installed, it fails, so that a test
// never passes there by not running.
package realserver

import (
	"os"
	"testing"
)

// Unavailable skips t with msg, or fails it with msg under CI=true.
func Unavailable(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true and " + msg)
	}
	t.Skip(msg)
}

// Missing is Unavailable for a server's binary that is not installed:
// "redis-server not found: install it (apt-get install redis-server) or
// set SLUICE_REDIS_URL". aptPackage is the Debian package that has it;
// envURL, when not empty, names the variable that points the tests at a
// running server instead.
func Missing(t testing.TB, binary, aptPackage, envURL string) {
	t.Helper()
	Unavailable(t, Message(binary, aptPackage, envURL))
}

// Message is Missing's message.
func Message(binary, aptPackage, envURL string) string {
	msg := binary + " not found: install it (apt-get install " + aptPackage + ")"
	if envURL != "" {
		msg += " or set " + envURL
	}
	return msg
}
