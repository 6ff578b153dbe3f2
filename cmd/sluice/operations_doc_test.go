package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/postgres/pgtest"
)

const operationsDoc = "../../docs/operations.md"

// servedMetrics builds the registry that sluice serve's /metrics serves
// on the store of storeURL, wired as serve wires it, and returns the
// families it holds with their type ("" for a vector that has no series
// yet). A vector's family is only gathered once it has a series, so the
// names come from every collector's descriptions as well.
func servedMetrics(t *testing.T, storeURL string) map[string]string {
	t.Helper()
	_, p, err := loadPolicy("")
	if err != nil {
		t.Fatal(err)
	}
	rs := withFlags(defaultSettings(t), serveFlags{})
	rs.StoreURL = storeURL
	reg := newRegistry()
	store, closeStore, err := openStore(context.Background(), storeURL, reg)
	if err != nil {
		t.Fatalf("%s: %v", storeURL, err)
	}
	t.Cleanup(func() { closeStore() })
	_, closeServer, err := newServer(p, rs, store, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeServer)

	families := map[string]string{}
	descs := make(chan *prometheus.Desc)
	go func() { reg.Describe(descs); close(descs) }()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in the description %s", d)
		}
		families[m[1]] = ""
	}
	gathered, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range gathered {
		families[f.GetName()] = strings.ToLower(f.GetType().String())
	}
	return families
}

// metricsSection is docs/operations.md's "## Metrics" section.
func metricsSection(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n## Metrics\n")
	if start < 0 {
		t.Fatal("docs/operations.md has no ## Metrics section")
	}
	section := doc[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	return section
}

// everyExportedMetric is every metric family sluice serve's /metrics can
// export on the memory store, on Redis and on PostgreSQL (each opened
// for real: the stores register their own families), with its type
// where gathered and the stores that export it.
func everyExportedMetric(t *testing.T) (exported map[string]string, from map[string][]string) {
	t.Helper()
	pg := pgtest.ForTest(t)
	db, err := pg.NewDatabase(pgtest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]string{
		"memory":   "memory://",
		"redis":    "redis://" + redistest.Server(t),
		"postgres": withParams(db, "sluice_migrate=true&sluice_violations=true"),
	}
	exported = map[string]string{} // family: its type where gathered
	from = map[string][]string{}   // family: the stores that export it
	for name, url := range stores {
		for f, typ := range servedMetrics(t, url) {
			if typ != "" || exported[f] == "" {
				exported[f] = typ
			}
			from[f] = append(from[f], name)
		}
	}
	for _, want := range []string{"sluice_live_keys", "sluice_redis_breaker_state", "sluice_postgres_violations_written_total", "sluice_decisions_total", "sluice_ready"} {
		if _, ok := exported[want]; !ok {
			t.Errorf("%s is not among the families found: the stores were not wired as serve wires them", want)
		}
	}
	return exported, from
}

// Every metric family sluice serve's /metrics can export, on each store,
// is documented in docs/operations.md's Metrics section, with its type;
// and every sluice_ metric the section names is one of them.
func TestOperationsDocListsEveryMetric(t *testing.T) {
	exported, from := everyExportedMetric(t)

	section := metricsSection(t)
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("`(sluice_[a-z0-9_]+)").FindAllStringSubmatch(section, -1) {
		documented[m[1]] = true
	}
	// A row of a table: | `name` | type | ...
	rowType := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z0-9_]+)` \\| ([a-z]+) \\|").FindAllStringSubmatch(section, -1) {
		rowType[m[1]] = m[2]
	}
	// Families documented as a group: `go_*`.
	var prefixes []string
	for _, m := range regexp.MustCompile("`([a-z]+_)\\*`").FindAllStringSubmatch(section, -1) {
		prefixes = append(prefixes, m[1])
	}

	var names []string
	for f := range exported {
		names = append(names, f)
	}
	slices.Sort(names)
	for _, f := range names {
		if !strings.HasPrefix(f, "sluice_") {
			if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(f, p) }) {
				t.Errorf("%s (exported on %v) is not documented in docs/operations.md: neither by name nor by a `prefix_*` group", f, from[f])
			}
			continue
		}
		typ, ok := rowType[f]
		if !ok {
			t.Errorf("%s (exported on %v) has no row (| `%s` | type | ...) in docs/operations.md's Metrics section", f, from[f], f)
			continue
		}
		if exported[f] != "" && exported[f] != typ {
			t.Errorf("docs/operations.md says %s is a %s; /metrics exports a %s", f, typ, exported[f])
		}
	}
	for name := range documented {
		base := name
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && (exported[b] == "histogram" || rowType[b] == "histogram") {
				base = b
			}
		}
		if _, ok := exported[base]; !ok {
			t.Errorf("docs/operations.md's Metrics section names %s, which no store's /metrics exports", name)
		}
	}
}
