// Package pgtest starts a throwaway PostgreSQL cluster for tests: initdb
// and pg_ctl in a temporary directory, listening on a free loopback port
// with its unix socket in that directory, fsync off. When
// SLUICE_POSTGRES_URL is set it is used instead. A missing server makes
// the tests skip, except under CI=true, where it is a failure.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/realserver"
)

// EnvURL names the environment variable holding an existing server's URL.
const EnvURL = "SLUICE_POSTGRES_URL"

// Server is a running PostgreSQL.
type Server struct {
	// URL connects to the server's "postgres" database as a superuser.
	URL  string
	dir  string
	ctl  string
	as   []string // command prefix that runs as the cluster's owner
	owns bool
	mu   sync.Mutex
	dbs  []string // databases NewDatabase created
}

// ErrMissing reports that no PostgreSQL binaries were found.
var ErrMissing = errors.New(realserver.Message("initdb", "postgresql", EnvURL))

// Start returns the server of SLUICE_POSTGRES_URL, or starts a new cluster.
// Call Stop when done.
func Start() (*Server, error) {
	if u := os.Getenv(EnvURL); u != "" {
		return &Server{URL: u}, nil
	}
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, ctl: filepath.Join(bin, "pg_ctl"), owns: true}
	if os.Geteuid() == 0 {
		// initdb refuses to run as root: hand the directory to an
		// unprivileged account and run the server as it.
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: running as root needs a postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		runuser, err := exec.LookPath("runuser")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: running as root needs runuser: %w", err)
		}
		s.as = []string{runuser, "-u", "postgres", "--"}
	}
	data := filepath.Join(dir, "data")
	if out, err := s.run(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C"); err != nil {
		s.Stop()
		return nil, fmt.Errorf("pgtest: initdb: %v: %s", err, out)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		ports, err := realserver.FreePorts(1)
		if err != nil {
			s.Stop()
			return nil, err
		}
		port := ports[0]
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", port, dir)
		out, err := s.run(s.ctl, "-D", data, "-l", filepath.Join(dir, "log"), "-o", opts, "-w", "-t", "60", "start")
		if err == nil {
			s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
			return s, nil
		}
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		lastErr = fmt.Errorf("pgtest: pg_ctl start: %v: %s\n%s", err, out, log)
	}
	s.Stop()
	return nil, lastErr
}

func (s *Server) run(name string, args ...string) ([]byte, error) {
	argv := append(append(append([]string(nil), s.as...), name), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
}

// Stop stops a cluster Start started and removes its directory. On a
// server given by SLUICE_POSTGRES_URL it drops the databases NewDatabase
// created instead.
func (s *Server) Stop() {
	if !s.owns {
		s.dropDatabases()
		return
	}
	if _, err := os.Stat(filepath.Join(s.dir, "data", "postmaster.pid")); err == nil {
		s.run(s.ctl, "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "stop")
	}
	os.RemoveAll(s.dir)
}

// Halt stops a cluster Start started, in fast mode (the server ends its
// sessions with admin_shutdown, 57P01, and refuses connections after),
// and keeps its directory for Stop: a server that went away under a
// client. A server given by SLUICE_POSTGRES_URL is not this process's to
// stop: Halt returns an error.
func (s *Server) Halt() error {
	if !s.owns {
		return fmt.Errorf("pgtest: the server of %s is not this process's to stop", EnvURL)
	}
	if out, err := s.run(s.ctl, "-D", filepath.Join(s.dir, "data"), "-m", "fast", "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop: %v: %s", err, out)
	}
	return nil
}

var dbSeq atomic.Int64

// NewDatabase creates an empty database on the server and returns its URL.
// Tests that need a schema of their own (migrations, rules) use one each.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		return "", fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("sluice_test_%d_%d", os.Getpid(), dbSeq.Add(1))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("pgtest: create database: %w", err)
	}
	s.mu.Lock()
	s.dbs = append(s.dbs, name)
	s.mu.Unlock()
	return replaceDatabase(s.URL, name), nil
}

func (s *Server) dropDatabases() {
	s.mu.Lock()
	dbs := s.dbs
	s.dbs = nil
	s.mu.Unlock()
	if len(dbs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	for _, db := range dbs {
		conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
	}
}

// replaceDatabase swaps the database of a postgres:// URL.
func replaceDatabase(rawURL, db string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	hostPath, query, hasQuery := strings.Cut(rest, "?")
	host, _, _ := strings.Cut(hostPath, "/")
	out := scheme + "://" + host + "/" + db
	if hasQuery {
		out += "?" + query
	}
	return out
}

// Main runs a package's tests with one server for the whole package, for
// TestMain: func TestMain(m *testing.M) { pgtest.Main(m, &server) }. When
// no server can be found *srv stays nil and Require skips (or fails under
// CI=true).
func Main(m *testing.M, srv **Server) {
	s, err := Start()
	if err != nil {
		startErr = err
	}
	*srv = s
	code := m.Run()
	if s != nil {
		s.Stop()
	}
	os.Exit(code)
}

var startErr error

// Require skips t when s is nil (no server), or fails it under CI=true.
func Require(t testing.TB, s *Server) {
	t.Helper()
	if s != nil {
		return
	}
	msg := "PostgreSQL not available"
	if startErr != nil {
		msg = startErr.Error()
	}
	realserver.Unavailable(t, msg)
}

// ForTest starts a server for one test and stops it when the test ends;
// for packages whose tests share no TestMain.
func ForTest(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		startErr = err
		Require(t, nil)
	}
	t.Cleanup(s.Stop)
	return s
}

// Context returns a context with a deadline generous enough for any single
// test step.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func findBin() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if _, err := exec.LookPath("initdb"); err == nil {
			if r, err := filepath.EvalSymlinks(p); err == nil {
				return filepath.Dir(r), nil
			}
			return filepath.Dir(p), nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		return "", ErrMissing
	}
	// The newest version sorts last (for single-digit majors it also does
	// lexically; compare numerically to be sure).
	best, bestV := "", -1
	for _, m := range matches {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(m))))
		if v > bestV {
			best, bestV = filepath.Dir(m), v
		}
	}
	return best, nil
}
