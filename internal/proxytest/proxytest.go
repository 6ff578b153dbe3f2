// Package proxytest runs real front proxies (nginx, Caddy) for tests in
// front of a sluice and an app that the test started, from a config file
// whose addresses the test rewrites to free loopback ports. Without the
// proxy's binary the test skips, unless CI=true (see testbin.Find).
package proxytest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/lockedbuf"
	"github.com/sluicehq/sluice/internal/realserver"
	"github.com/sluicehq/sluice/internal/testbin"
)

// FreeAddr returns a loopback address whose port was free a moment ago
// (realserver.FreePorts).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ports, err := realserver.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(ports[0])
}

// Rewrite replaces the first occurrence of each pair's old text in cfg
// with its new text, failing the test when one is missing: a config that
// no longer holds the address a test rewrites must not run unrewritten.
func Rewrite(t testing.TB, name, cfg string, pairs ...[2]string) string {
	t.Helper()
	for _, p := range pairs {
		if !strings.Contains(cfg, p[0]) {
			t.Fatalf("%s no longer contains %q", name, p[0])
		}
		cfg = strings.Replace(cfg, p[0], p[1], 1)
	}
	return cfg
}

// Nginx runs conf (an nginx.conf whose addresses are rewritten already,
// with an "http {" block) in a real nginx until the test ends, waits for
// it to listen on addr and returns a function that reads its logs. Its
// temporary files and logs go to a directory of the test's.
func Nginx(t testing.TB, conf, addr string) (logs func() string) {
	t.Helper()
	bin := testbin.Find(t, "nginx", "/usr/sbin/nginx")
	dir := t.TempDir()
	conf = Rewrite(t, "nginx.conf", conf, [2]string{"http {", "http {\n" +
		"    access_log " + filepath.Join(dir, "access.log") + ";\n" +
		"    client_body_temp_path " + filepath.Join(dir, "body") + ";\n" +
		"    proxy_temp_path " + filepath.Join(dir, "proxy") + ";\n" +
		"    fastcgi_temp_path " + filepath.Join(dir, "fastcgi") + ";\n" +
		"    uwsgi_temp_path " + filepath.Join(dir, "uwsgi") + ";\n" +
		"    scgi_temp_path " + filepath.Join(dir, "scgi") + ";\n"})
	if os.Geteuid() == 0 {
		conf = "user root;\n" + conf
	}
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	errLog := filepath.Join(dir, "error.log")
	out := &lockedbuf.Buffer{}
	cmd := exec.Command(bin, "-p", dir, "-c", confPath, "-e", errLog,
		"-g", "daemon off; master_process on; worker_processes 1; pid "+filepath.Join(dir, "nginx.pid")+"; error_log "+errLog+" warn;")
	logs = func() string {
		b, _ := os.ReadFile(errLog)
		return out.String() + string(b)
	}
	run(t, "nginx", cmd, out, addr, logs)
	return logs
}

// Caddy runs conf (a Caddyfile whose addresses are rewritten already) in
// a real Caddy until the test ends, waits for it to listen on addr and
// returns a function that reads its logs. It runs without an admin
// endpoint or certificates, its state in a directory of the test's.
func Caddy(t testing.TB, conf, addr string) (logs func() string) {
	t.Helper()
	bin := testbin.Find(t, "caddy", "/usr/bin/caddy")
	dir := t.TempDir()
	// The global options block must come first; comments may precede it.
	conf = "{\n\tadmin off\n\tauto_https off\n\tstorage file_system " + filepath.Join(dir, "data") + "\n}\n\n" + conf
	confPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	out := &lockedbuf.Buffer{}
	cmd := exec.Command(bin, "run", "--config", confPath, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"HOME="+dir,
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
	)
	run(t, "caddy", cmd, out, addr, out.String)
	return out.String
}

// run starts cmd, stops it (SIGINT: a fast, clean shutdown for both
// proxies) when the test ends, and waits for it to listen on addr.
func run(t testing.TB, name string, cmd *exec.Cmd, out *lockedbuf.Buffer, addr string, logs func() string) {
	t.Helper()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	WaitListening(t, name, addr, func() bool {
		select {
		case <-exited:
			return true
		default:
			return false
		}
	}, logs)
}

// WaitListening waits until a server process listens on addr, failing the
// test with its logs if it exits or does not come up in time.
func WaitListening(t testing.TB, name, addr string, exited func() bool, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if exited() {
			t.Fatalf("%s exited before listening on %s\n%s", name, addr, logs())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not come up on %s: %v\n%s", name, addr, err, logs())
		}
		time.Sleep(50 * time.Millisecond) // waiting for a process to listen, not for tokens
	}
}
