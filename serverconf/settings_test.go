package serverconf_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/serverconf"
)

// serverconf is settings and their checks: it imports the standard
// library only, so that what reads it (the policy loader, the gRPC and
// HTTP servers) takes nothing else in with it.
func TestImportsStandardLibraryOnly(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		ast, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range ast.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s", f, path)
			}
		}
	}
}

// The defaults bound every listener, and the gRPC address follows listen.
func TestDefault(t *testing.T) {
	d := serverconf.Default()
	if d.Listen != ":8080" || d.GRPCListen != ":8081" || !d.GRPCListenDerived || d.StoreURL != "memory://" {
		t.Fatalf("addresses: %+v", d)
	}
	if d.Server != serverconf.DefaultServerLimits || d.GRPC != serverconf.DefaultGRPCLimits {
		t.Fatalf("bounds: %+v %+v", d.Server, d.GRPC)
	}
}

// A store URL the loader refuses is not repeated in its message: it holds
// the store's password, and the message goes to the log on a reload.
func TestAttackStoreURLErrorEchoesPassword(t *testing.T) {
	for _, bad := range []string{"redis://:hunter2@h:port", "redis//:hunter2@h:6379", "postgres://u:hunter2@db/app%zz"} {
		if msg := serverconf.CheckStoreURL(bad); msg == "" || strings.Contains(msg, "hunter2") {
			t.Errorf("%s: %q, want a refusal without the password", bad, msg)
		}
	}
}

// A listener's per-client cap: the setting, else a quarter of the
// listener's, at least one and at most DefaultMaxConnsPerClient.
func TestConnsPerClient(t *testing.T) {
	for _, c := range []struct{ set, conns, want int }{
		{0, 10000, serverconf.DefaultMaxConnsPerClient}, {0, 100, 25}, {0, 2, 1}, {7, 10000, 7},
	} {
		if got := (serverconf.ServerLimits{MaxConnsPerClient: c.set}).ConnsPerClient(c.conns); got != c.want {
			t.Errorf("max_conns_per_client %d of %d: %d, want %d", c.set, c.conns, got, c.want)
		}
	}
}
