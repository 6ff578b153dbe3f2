// Package redistest starts throwaway redis-server processes, and clusters
// of them, on free loopback ports in temporary directories, never
// touching a system Redis: the one way every test and benchmark of the
// tree starts Redis. Without redis-server a test skips, unless CI=true
// (realserver.Missing).
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/realserver"
)

// Proc is one redis-server process.
type Proc struct {
	Host string
	Port int
	Dir  string
	args []string
	cmd  *exec.Cmd
}

// Addr is the server's host:port.
func (p *Proc) Addr() string { return net.JoinHostPort(p.Host, strconv.Itoa(p.Port)) }

// Need skips (or under CI=true fails) tb when the binary name
// (redis-server or redis-cli) is missing; envURL names the variable that
// would point tb at a running server instead ("" when tb needs a server
// of its own).
func Need(tb testing.TB, name, envURL string) {
	tb.Helper()
	if _, err := exec.LookPath(name); err != nil {
		pkg := "redis-server"
		if name == "redis-cli" {
			pkg = "redis-tools"
		}
		realserver.Missing(tb, name, pkg, envURL)
	}
}

// Start starts redis-server on 127.0.0.1:port, in dir, with extra config
// arguments, and returns once it answers PING. The caller stops it.
func Start(port int, dir string, extra ...string) (*Proc, error) {
	return startOn("127.0.0.1", port, dir, extra...)
}

func startOn(host string, port int, dir string, extra ...string) (*Proc, error) {
	p := &Proc{Host: host, Port: port, Dir: dir}
	p.args = append([]string{"--port", strconv.Itoa(port), "--bind", host, "--save", "", "--appendonly", "no", "--dir", dir}, extra...)
	return p, p.Start()
}

// Start (re)starts the process with the arguments it was first started
// with, and returns once it answers PING.
func (p *Proc) Start() error {
	p.cmd = exec.Command("redis-server", p.args...)
	p.cmd.Dir = p.Dir
	log, err := os.Create(filepath.Join(p.Dir, "redis.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if ping(p.Addr()) {
			return nil
		}
		time.Sleep(20 * time.Millisecond) // waiting for the server, not for tokens
	}
	b, _ := os.ReadFile(filepath.Join(p.Dir, "redis.log"))
	p.Stop()
	return fmt.Errorf("redis-server on %s did not start: %s", p.Addr(), b)
}

// ping says whether addr answers PING with PONG, in RESP, so that
// starting a server needs no redis-cli.
func ping(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.TrimSpace(line) == "+PONG"
}

// Stop kills the server (SIGKILL: a crash, no goodbye to its peers).
func (p *Proc) Stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Kill()
		p.cmd.Wait()
		p.cmd = nil
	}
}

// Signal sends sig to the running process: SIGSTOP hangs the server
// without closing a connection, SIGCONT resumes it.
func (p *Proc) Signal(sig os.Signal) error {
	if p.cmd == nil || p.cmd.Process == nil {
		return fmt.Errorf("redis-server on %s is not running", p.Addr())
	}
	return p.cmd.Process.Signal(sig)
}

// CLI runs redis-cli against addr.
func CLI(addr string, args ...string) (string, error) {
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	return string(out), err
}

// New starts a private redis-server with extra config arguments for one
// test, stopped when it ends.
func New(tb testing.TB, extra ...string) *Proc {
	tb.Helper()
	Need(tb, "redis-server", "")
	ports, err := realserver.FreePorts(1)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := Start(ports[0], tb.TempDir(), extra...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Stop)
	return p
}

// Server runs a private redis-server on a free loopback port until the
// test ends, and returns its address. SLUICE_REDIS_URL is not used: the
// caller gets a server of its own to count on.
func Server(tb testing.TB) string {
	tb.Helper()
	return New(tb).Addr()
}

// ServerOn is Server on a loopback address the caller chose (one that
// nothing listens on yet), for a test of what happens before Redis is up.
func ServerOn(tb testing.TB, addr string) string {
	tb.Helper()
	Need(tb, "redis-server", "")
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := startOn(host, n, tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Stop)
	return addr
}

// Sentinel starts a Redis Sentinel for one test, monitoring primary as
// the set name with a quorum of one, and returns its address once it
// names primary as the set's primary.
func Sentinel(tb testing.TB, name string, primary *Proc) string {
	tb.Helper()
	Need(tb, "redis-server", "")
	Need(tb, "redis-cli", "")
	ports, err := realserver.FreePorts(1)
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %d 1\nsentinel down-after-milliseconds %s 1000\n",
		ports[0], dir, name, primary.Host, primary.Port, name)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		tb.Fatal(err)
	}
	p := &Proc{Host: "127.0.0.1", Port: ports[0], Dir: dir, args: []string{conf, "--sentinel"}}
	if err := p.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Stop)
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, err := CLI(p.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
		if err == nil && strings.Contains(out, strconv.Itoa(primary.Port)) {
			return p.Addr()
		}
		if time.Now().After(deadline) {
			tb.Fatalf("sentinel not ready: %v %s", err, out)
		}
		time.Sleep(50 * time.Millisecond) // waiting for the sentinel, not for tokens
	}
}

// StartCluster builds a Redis Cluster of 6 servers, 3 primaries with a
// replica each, with a short node timeout so that failover is quick. Each
// server runs in a directory of mkdir's; the servers started are returned
// even with an error, for the caller to stop.
func StartCluster(mkdir func() (string, error)) ([]*Proc, error) { return startCluster(mkdir, 6, 1) }

// StartPrimaries is StartCluster with n primaries (at least 3) and no
// replicas, which go on serving their slots when one of them dies
// (cluster-require-full-coverage no): the dead one's slots fail for good.
func StartPrimaries(mkdir func() (string, error), n int) ([]*Proc, error) {
	return startCluster(mkdir, n, 0, "--cluster-require-full-coverage", "no")
}

// Primaries is StartPrimaries for a test: the servers stop when it ends,
// and a missing redis-server or redis-cli skips it (fails under CI=true).
// It returns the servers and their addresses.
func Primaries(t testing.TB, n int) ([]*Proc, []string) {
	t.Helper()
	Need(t, "redis-server", "")
	Need(t, "redis-cli", "")
	srvs, err := StartPrimaries(func() (string, error) { return t.TempDir(), nil }, n)
	for _, p := range srvs {
		t.Cleanup(p.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	addrs := make([]string, len(srvs))
	for i, p := range srvs {
		addrs[i] = p.Addr()
	}
	return srvs, addrs
}

func startCluster(mkdir func() (string, error), n, replicas int, extra ...string) ([]*Proc, error) {
	ports, err := realserver.FreePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var procs []*Proc
	var addrs []string
	for i := range n {
		dir, err := mkdir()
		if err != nil {
			return procs, err
		}
		args := append([]string{"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(ports[n+i]),
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--cluster-node-timeout", "1000", "--repl-diskless-sync-delay", "0"}, extra...)
		p, err := Start(ports[i], dir, args...)
		if err != nil {
			return procs, err
		}
		procs = append(procs, p)
		addrs = append(addrs, p.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		return procs, fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	return procs, WaitClusterOK(addrs, 30*time.Second)
}

// WaitClusterOK waits until every node reports cluster_state:ok and every
// replica is in sync with its primary (a replica that never synced will
// not take over).
func WaitClusterOK(addrs []string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		ok := true
		for _, a := range addrs {
			out, err := CLI(a, "CLUSTER", "INFO")
			if err != nil || !strings.Contains(out, "cluster_state:ok") {
				ok = false
				break
			}
			out, err = CLI(a, "INFO", "replication")
			if err != nil || (strings.Contains(out, "role:slave") && !strings.Contains(out, "master_link_status:up")) {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // waiting for the cluster, not for tokens
	}
	return fmt.Errorf("cluster not ok after %v", limit)
}
