package redis_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/realserver"
)

// The test helpers start their own redis-server processes on free loopback
// ports, in temporary directories, never touching a system Redis. With
// SLUICE_REDIS_URL (SLUICE_REDIS_CLUSTER_URL) set, that server (cluster) is
// used instead. Without redis-server the tests skip, unless CI=true
// (realserver.Missing).

// server is one redis-server process.
type server struct {
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// needBinary skips (or under CI=true fails) tb when redis-server or
// redis-cli is missing; envURL names the variable that would point tb at
// a running server instead ("" when tb needs a server of its own).
func needBinary(tb testing.TB, name, envURL string) {
	tb.Helper()
	if _, err := exec.LookPath(name); err != nil {
		pkg := "redis-server"
		if name == "redis-cli" {
			pkg = "redis-tools"
		}
		realserver.Missing(tb, name, pkg, envURL)
	}
}

// freePorts returns n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startServer starts redis-server with extra config arguments.
func startServer(port int, dir string, extra ...string) (*server, error) {
	s := &server{port: port, dir: dir}
	s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}, extra...)
	return s, s.start()
}

func (s *server) start() error {
	s.cmd = exec.Command("redis-server", s.args...)
	s.cmd.Dir = s.dir
	log, err := os.Create(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return err
	}
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if out, err := cli(s.addr(), "PING"); err == nil && strings.TrimSpace(out) == "PONG" {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	s.stop()
	return fmt.Errorf("redis-server on %d did not start: %s", s.port, b)
}

// stop kills the server (SIGKILL: a crash, no goodbye to its peers).
func (s *server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// cli runs redis-cli against addr.
func cli(addr string, args ...string) (string, error) {
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	return string(out), err
}

// newStandalone starts a private redis-server for one test.
func newStandalone(t *testing.T) *server {
	t.Helper()
	needBinary(t, "redis-server", "")
	needBinary(t, "redis-cli", "")
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	s, err := startServer(ports[0], t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

// shared is the package's standalone server and cluster, started on first
// use and stopped by TestMain.
var shared struct {
	mu          sync.Mutex
	single      string
	singleSrv   *server
	cluster     []string
	clusterSrvs []*server
	dirs        []string
}

func TestMain(m *testing.M) {
	code := m.Run()
	shared.mu.Lock()
	if shared.singleSrv != nil {
		shared.singleSrv.stop()
	}
	for _, s := range shared.clusterSrvs {
		s.stop()
	}
	for _, d := range shared.dirs {
		os.RemoveAll(d)
	}
	shared.mu.Unlock()
	os.Exit(code)
}

// standaloneURL is the shared standalone server's URL (or
// SLUICE_REDIS_URL).
func standaloneURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("SLUICE_REDIS_URL"); u != "" {
		return u
	}
	needBinary(t, "redis-server", "SLUICE_REDIS_URL")
	needBinary(t, "redis-cli", "SLUICE_REDIS_URL")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.single != "" {
		return shared.single
	}
	dir, err := os.MkdirTemp("", "sluice-redis-")
	if err != nil {
		t.Fatal(err)
	}
	shared.dirs = append(shared.dirs, dir)
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	s, err := startServer(ports[0], dir)
	if err != nil {
		t.Fatal(err)
	}
	shared.singleSrv = s
	shared.single = "redis://" + s.addr()
	return shared.single
}

// clusterURL is the shared 3-primary, 3-replica cluster (or
// SLUICE_REDIS_CLUSTER_URL's), as a redis+cluster URL.
func clusterURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("SLUICE_REDIS_CLUSTER_URL"); u != "" {
		return u
	}
	needBinary(t, "redis-server", "SLUICE_REDIS_CLUSTER_URL")
	needBinary(t, "redis-cli", "SLUICE_REDIS_CLUSTER_URL")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster == nil {
		srvs, err := startCluster()
		shared.clusterSrvs = srvs
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range srvs {
			shared.cluster = append(shared.cluster, s.addr())
		}
	}
	return "redis+cluster://" + strings.Join(shared.cluster, ",")
}

// startCluster builds a Redis Cluster of 6 servers, 3 primaries with a
// replica each, with a short node timeout so that failover is quick.
func startCluster() ([]*server, error) {
	ports, err := freePorts(12)
	if err != nil {
		return nil, err
	}
	var srvs []*server
	var addrs []string
	for i := range 6 {
		dir, err := os.MkdirTemp("", "sluice-redis-cluster-")
		if err != nil {
			return srvs, err
		}
		shared.dirs = append(shared.dirs, dir)
		s, err := startServer(ports[i], dir, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(ports[6+i]),
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--cluster-node-timeout", "1000", "--repl-diskless-sync-delay", "0")
		if err != nil {
			return srvs, err
		}
		srvs = append(srvs, s)
		addrs = append(addrs, s.addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		return srvs, fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	if err := waitClusterOK(addrs, 30*time.Second); err != nil {
		return srvs, err
	}
	return srvs, nil
}

// waitClusterOK waits until every node reports cluster_state:ok and every
// replica is in sync with its primary (a replica that never synced will not
// take over).
func waitClusterOK(addrs []string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		ok := true
		for _, a := range addrs {
			out, err := cli(a, "CLUSTER", "INFO")
			if err != nil || !strings.Contains(out, "cluster_state:ok") {
				ok = false
				break
			}
			out, err = cli(a, "INFO", "replication")
			if err != nil || (strings.Contains(out, "role:slave") && !strings.Contains(out, "master_link_status:up")) {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("cluster not ok after %v", limit)
}
