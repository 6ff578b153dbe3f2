package redis_test

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/internal/realserver"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The test helpers start their own redis-server processes (redistest). With
// SLUICE_REDIS_URL (SLUICE_REDIS_CLUSTER_URL) set, that server (cluster) is
// used instead.

// newStandalone starts a private redis-server for one test, which may
// drive it with redis-cli.
func newStandalone(t *testing.T) *redistest.Proc {
	t.Helper()
	redistest.Need(t, "redis-cli", "")
	return redistest.New(t)
}

// shared is the package's standalone server and cluster, started on first
// use and stopped by TestMain.
var shared struct {
	mu          sync.Mutex
	single      string
	singleSrv   *redistest.Proc
	cluster     []string
	clusterSrvs []*redistest.Proc
	dirs        []string
}

func TestMain(m *testing.M) {
	code := m.Run()
	shared.mu.Lock()
	if shared.singleSrv != nil {
		shared.singleSrv.Stop()
	}
	for _, s := range shared.clusterSrvs {
		s.Stop()
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
	redistest.Need(t, "redis-server", "SLUICE_REDIS_URL")
	redistest.Need(t, "redis-cli", "SLUICE_REDIS_URL")
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
	ports, err := realserver.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	s, err := redistest.Start(ports[0], dir)
	if err != nil {
		t.Fatal(err)
	}
	shared.singleSrv = s
	shared.single = "redis://" + s.Addr()
	return shared.single
}

// clusterURL is the shared 3-primary, 3-replica cluster (or
// SLUICE_REDIS_CLUSTER_URL's), as a redis+cluster URL.
func clusterURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("SLUICE_REDIS_CLUSTER_URL"); u != "" {
		return u
	}
	redistest.Need(t, "redis-server", "SLUICE_REDIS_CLUSTER_URL")
	redistest.Need(t, "redis-cli", "SLUICE_REDIS_CLUSTER_URL")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster == nil {
		srvs, err := redistest.StartCluster(func() (string, error) {
			dir, err := os.MkdirTemp("", "sluice-redis-cluster-")
			if err == nil {
				shared.dirs = append(shared.dirs, dir)
			}
			return dir, err
		})
		shared.clusterSrvs = srvs
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range srvs {
			shared.cluster = append(shared.cluster, s.Addr())
		}
	}
	return "redis+cluster://" + strings.Join(shared.cluster, ",")
}
