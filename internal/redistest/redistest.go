// Package redistest starts throwaway redis-server processes for tests in
// packages other than redis (whose own helpers also run clusters).
package redistest

import (
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/realserver"
)

// Server runs a private redis-server on a free loopback port, in a
// temporary directory, until the test ends, and returns its address.
// SLUICE_REDIS_URL is not used: the caller gets a server of its own to
// count on. Without redis-server the test skips, unless CI=true.
func Server(t testing.TB) string {
	t.Helper()
	need(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return ServerOn(t, addr)
}

// ServerOn is Server on a loopback address the caller chose (one that
// nothing listens on yet), for a test of what happens before Redis is up.
func ServerOn(t testing.TB, addr string) string {
	t.Helper()
	need(t)
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", "--port", port, "--bind", host, "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not start", addr)
		}
		time.Sleep(20 * time.Millisecond) // waiting for the server, not for tokens
	}
}

// need skips the test without redis-server, or fails it under CI=true.
func need(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		realserver.Missing(t, "redis-server", "redis-server", "SLUICE_REDIS_URL")
	}
}
