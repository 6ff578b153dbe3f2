// Package realserver says what a test does when a real server it needs
// (redis-server, PostgreSQL, nginx, Caddy) is not there: on a developer's
// machine it skips, saying what is missing and how to provide it; under
// CI=true, where every server must be installed, it fails, so that a test
// never passes there by not running.
package realserver

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
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

// FreePorts returns n distinct loopback ports free a moment ago, below
// the kernel's ephemeral ports (32768 and up by default), which another
// test's outgoing connection could take before the server binds one.
func FreePorts(n int) ([]int, error) {
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		port := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil && tries < 1000 {
			continue
		} else if err != nil {
			return nil, err
		}
		defer l.Close() // held until every port is picked: distinct ports
		ports = append(ports, port)
	}
	return ports, nil
}
