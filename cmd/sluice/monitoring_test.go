package main

// examples/grafana/sluice.json and examples/prometheus/alerts.yaml read
// sluice's metrics by name. A renamed or dropped metric would leave a
// panel blank and an alert silent without an error anywhere, so the
// tests read every PromQL expression of both files, take the metric
// names out of it, and check them against the registry sluice serve
// builds on the memory store, on Redis and on PostgreSQL.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const (
	dashboardFile = examplesDir + "/grafana/sluice.json"
	alertsFile    = examplesDir + "/prometheus/alerts.yaml"
)

// promqlWords are PromQL's functions, aggregations and keywords: the
// identifiers of an expression that are not metric names.
var promqlWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`
		abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp clamp_max clamp_min
		cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month deg delta deriv
		double_exponential_smoothing exp floor histogram_avg histogram_count histogram_fraction histogram_quantile
		histogram_stddev histogram_stdvar histogram_sum holt_winters hour idelta increase irate label_join label_replace
		last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month pi predict_linear
		present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort sort_by_label
		sort_by_label_desc sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time tan tanh time timestamp
		vector year
		avg bottomk count count_values group limit_ratio limitk max min quantile stddev stdvar sum topk
		and or unless bool offset atan2 inf nan start end`) {
		promqlWords[w] = true
	}
}

// promqlGrouping are the keywords followed by a list of label names.
var promqlGrouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promqlMetrics returns the metric names expr reads, in order, once
// each: the identifiers that are neither functions nor keywords, outside
// label matchers ({...}), ranges ([...]), grouping lists (by (...)),
// strings and Grafana's $variables. An identifier called as a function
// that PromQL does not know is an error: most likely a typo.
func promqlMetrics(expr string) ([]string, error) {
	var names []string
	r := []rune(expr)
	skipSpace := func(i int) int {
		for i < len(r) && strings.ContainsRune(" \t\r\n", r[i]) {
			i++
		}
		return i
	}
	// skipTo returns the index after the rune that closes what opens at
	// i, stepping over strings.
	skipTo := func(i int, open, closing rune) (int, error) {
		depth := 0
		for ; i < len(r); i++ {
			switch r[i] {
			case '"', '\'', '`':
				q := r[i]
				for i++; i < len(r) && r[i] != q; i++ {
					if r[i] == '\\' && q != '`' {
						i++
					}
				}
			case open:
				depth++
			case closing:
				if depth--; depth == 0 {
					return i + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("%q: an unclosed %c", expr, open)
	}
	isIdent := func(c rune, first bool) bool {
		return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9')
	}
	for i := 0; i < len(r); {
		c := r[i]
		switch {
		case c == '"' || c == '\'' || c == '`', c == '{', c == '[':
			open, closing := c, c
			switch c {
			case '{':
				closing = '}'
			case '[':
				closing = ']'
			}
			var err error
			if open == closing { // a string
				j := i + 1
				for ; j < len(r) && r[j] != c; j++ {
					if r[j] == '\\' && c != '`' {
						j++
					}
				}
				if j >= len(r) {
					return nil, fmt.Errorf("%q: an unclosed string", expr)
				}
				i = j + 1
				continue
			}
			if i, err = skipTo(i, open, closing); err != nil {
				return nil, err
			}
		case c == '#': // a comment, to the end of the line
			for i < len(r) && r[i] != '\n' {
				i++
			}
		case c == '$': // a Grafana variable: $name or ${name}
			i++
			if i < len(r) && r[i] == '{' {
				var err error
				if i, err = skipTo(i, '{', '}'); err != nil {
					return nil, err
				}
				continue
			}
			for i < len(r) && isIdent(r[i], false) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.': // a number or a duration
			for i < len(r) && (isIdent(r[i], false) || r[i] == '.' || ((r[i] == '+' || r[i] == '-') && (r[i-1] == 'e' || r[i-1] == 'E'))) {
				i++
			}
		case isIdent(c, true):
			j := i
			for j < len(r) && isIdent(r[j], false) {
				j++
			}
			word := string(r[i:j])
			next := skipSpace(j)
			called := next < len(r) && r[next] == '('
			switch {
			case promqlGrouping[word]:
				if called {
					var err error
					if j, err = skipTo(next, '(', ')'); err != nil {
						return nil, err
					}
				}
			case promqlWords[strings.ToLower(word)]:
			case called:
				return nil, fmt.Errorf("%q: %s( is not a PromQL function", expr, word)
			default:
				if !slices.Contains(names, word) {
					names = append(names, word)
				}
			}
			i = j
		default:
			i++
		}
	}
	return names, nil
}

func TestPromQLMetrics(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (rule, result) (rate(sluice_decisions_total{job=~"$job", rule=~"$rule"}[$__rate_interval]))`:    {"sluice_decisions_total"},
		`histogram_quantile(0.99, sum by (le, op) (rate(sluice_store_latency_seconds_bucket{op!="x{y}"}[5m])))`: {"sluice_store_latency_seconds_bucket"},
		"a / on (job) group_left(rule) b offset 1h > bool 1e3 # c{d}\n or c":                                    {"a", "b", "c"},
		`sum(rate(x[1h] offset 10m)) without (instance) * 0 unless ${v} and y @ start()`:                        {"x", "y"},
		`max_over_time(m[5m:1m]) > 0.5 and label_replace(n, "dst", "$1", "src", "(.*)")`:                        {"m", "n"},
		`sluice:recorded:rate5m`: {"sluice:recorded:rate5m"},
	} {
		got, err := promqlMetrics(expr)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %v, %v; want %v", expr, got, err, want)
		}
	}
	for _, bad := range []string{`rat(x[5m])`, `sum(x{a="b"`, `x{a="}`} {
		if got, err := promqlMetrics(bad); err == nil {
			t.Errorf("%s: %v, want an error", bad, got)
		}
	}
}

// grafanaQuery is one query of the dashboard: a panel's target or a
// variable's.
type grafanaQuery struct {
	where, expr string
}

type grafanaPanel struct {
	ID          int             `json:"id"`
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	Datasource  json.RawMessage `json:"datasource"`
	GridPos     struct{ H, W, X, Y int }
	Targets     []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaDashboard struct {
	Title, UID    string
	SchemaVersion int            `json:"schemaVersion"`
	Panels        []grafanaPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name, Type string
			Definition string          `json:"definition"`
			Query      json.RawMessage `json:"query"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

// dashboardQueries reads the dashboard and checks its form: every panel
// titled and described, in the 24-column grid without overlap, on the
// dashboard's datasource variable (no data source of one Grafana named
// in the file), every target with a PromQL expression.
func dashboardQueries(t *testing.T, path string) []grafanaQuery {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion < 36 || len(d.Panels) == 0 {
		t.Fatalf("%s: title %q, uid %q, schemaVersion %d, %d panels", path, d.Title, d.UID, d.SchemaVersion, len(d.Panels))
	}
	const ds = `{"type":"prometheus","uid":"${datasource}"}`
	sameDS := func(raw json.RawMessage) bool {
		var a, b any
		return json.Unmarshal(raw, &a) == nil && json.Unmarshal([]byte(ds), &b) == nil && fmt.Sprint(a) == fmt.Sprint(b)
	}
	var queries []grafanaQuery
	hasDS := false
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
			hasDS = hasDS || v.Name == "datasource"
		case "query":
			if !sameDS(v.Datasource) {
				t.Errorf("variable %s: datasource %s, want %s", v.Name, v.Datasource, ds)
			}
			// label_values(SELECTOR, LABEL): the selector is PromQL.
			q := v.Definition
			inner, ok := strings.CutPrefix(q, "label_values(")
			if k := strings.LastIndex(inner, ","); !ok || k < 0 || !strings.HasSuffix(inner, ")") {
				t.Errorf("variable %s: %q, want label_values(METRIC, LABEL)", v.Name, q)
				continue
			} else {
				inner = inner[:k]
			}
			// The query is a string, or (Grafana 10 on) an object holding it.
			var query struct{ Query string }
			if err := json.Unmarshal(v.Query, &query.Query); err != nil {
				json.Unmarshal(v.Query, &query)
			}
			if query.Query != q {
				t.Errorf("variable %s: its query %s is not its definition %q", v.Name, v.Query, q)
			}
			queries = append(queries, grafanaQuery{"variable " + v.Name, inner})
		}
	}
	if !hasDS {
		t.Error(`no "datasource" variable: the panels would name one Grafana's data source`)
	}
	ids := map[int]bool{}
	cells := map[[2]int]string{}
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if ids[p.ID] || p.ID == 0 {
				t.Errorf("panel %q: id %d used twice or zero", p.Title, p.ID)
			}
			ids[p.ID] = true
			if p.Title == "" {
				t.Errorf("panel %d has no title", p.ID)
			}
			g := p.GridPos
			if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, g)
			}
			for x := g.X; x < g.X+g.W; x++ {
				for y := g.Y; y < g.Y+g.H; y++ {
					if other, ok := cells[[2]int{x, y}]; ok {
						t.Fatalf("panels %q and %q overlap at %d,%d", other, p.Title, x, y)
					}
					cells[[2]int{x, y}] = p.Title
				}
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Description == "" {
				t.Errorf("panel %q: no description (what it shows, what to do)", p.Title)
			}
			if !sameDS(p.Datasource) {
				t.Errorf("panel %q: datasource %s, want %s", p.Title, p.Datasource, ds)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q: no query", p.Title)
			}
			for _, tg := range p.Targets {
				if tg.Expr == "" || tg.RefID == "" || !sameDS(tg.Datasource) {
					t.Errorf("panel %q target %q: expr %q, datasource %s", p.Title, tg.RefID, tg.Expr, tg.Datasource)
				}
				queries = append(queries, grafanaQuery{fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), tg.Expr})
			}
		}
	}
	walk(d.Panels)
	return queries
}

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// alertQueries reads the rules file and checks each alert's form: a
// severity, a summary and a description.
func alertQueries(t *testing.T, path string) (queries []grafanaQuery, alerts []string) {
	t.Helper()
	var doc struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Record != "" {
				t.Errorf("%s: a rule that is not an alert: %+v", path, r)
				continue
			}
			alerts = append(alerts, r.Alert)
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q, want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: no summary or description", r.Alert)
			}
			queries = append(queries, grafanaQuery{"alert " + r.Alert, r.Expr})
		}
	}
	return queries, alerts
}

// monitoringMetrics returns the metric names the dashboard and the alerts
// read, each with where it is read.
func monitoringMetrics(t *testing.T) map[string][]string {
	t.Helper()
	queries := dashboardQueries(t, dashboardFile)
	aq, _ := alertQueries(t, alertsFile)
	names := map[string][]string{}
	for _, q := range append(queries, aq...) {
		ms, err := promqlMetrics(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		if len(ms) == 0 {
			t.Errorf("%s reads no metric: %q", q.where, q.expr)
		}
		for _, m := range ms {
			names[m] = append(names[m], q.where)
		}
	}
	return names
}

// checkGrafanaDashboard is the dashboard's form and its PromQL;
// TestMonitoringMetricsExported checks its metrics against a running
// sluice.
func checkGrafanaDashboard(t *testing.T, path string) {
	for _, q := range dashboardQueries(t, path) {
		ms, err := promqlMetrics(q.expr)
		if err != nil || len(ms) == 0 {
			t.Errorf("%s: %v %v", q.where, ms, err)
		}
		for _, m := range ms {
			if !strings.HasPrefix(m, "sluice_") {
				t.Errorf("%s reads %s, not one of sluice's metrics", q.where, m)
			}
		}
	}
}

// prometheusOwn are the series Prometheus itself writes for every
// target, which an alert may read beside sluice's (a process that is
// down exports nothing of its own).
var prometheusOwn = map[string]bool{"up": true}

// needPromtool returns promtool's path; without it the test skips, unless
// CI=true.
func needPromtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found and CI=true: install Debian's prometheus package")
		}
		t.Skip("promtool not found: install prometheus (it ships promtool) to check the rules")
	}
	return p
}

// checkPrometheusAlerts: each alert has a severity, a summary and a
// description, only sluice's metrics, and promtool accepts the file.
func checkPrometheusAlerts(t *testing.T, path string) {
	queries, alerts := alertQueries(t, path)
	if len(alerts) == 0 {
		t.Fatalf("%s: no alerts", path)
	}
	for _, q := range queries {
		ms, err := promqlMetrics(q.expr)
		if err != nil || len(ms) == 0 {
			t.Errorf("%s: %v %v", q.where, ms, err)
		}
		for _, m := range ms {
			if !strings.HasPrefix(m, "sluice_") && !prometheusOwn[m] {
				t.Errorf("%s reads %s, not one of sluice's metrics", q.where, m)
			}
		}
	}
	out, err := exec.Command(needPromtool(t), "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", path, err, out)
	}
}

// checkPromtoolTests runs the alerts' unit tests, and fails if an alert
// has none.
func checkPromtoolTests(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, alerts := alertQueries(t, alertsFile)
	for _, a := range alerts {
		if !strings.Contains(string(data), "alertname: "+a+"\n") {
			t.Errorf("%s tests no %s", path, a)
		}
	}
	out, err := exec.Command(needPromtool(t), "test", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules %s: %v\n%s", path, err, out)
	}
}

// family is the family a series name belongs to: a histogram's _bucket,
// _sum and _count series are the histogram's. A family whose type is ""
// (a vector with no series yet, known from its description only) may be
// a histogram.
func family(name string, families map[string]string) (string, bool) {
	if _, ok := families[name]; ok {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		typ, known := families[base]
		if ok && known && (typ == "histogram" || typ == "" || (typ == "summary" && suffix != "_bucket")) {
			return base, true
		}
	}
	return "", false
}

// deliberatelyAbsent are the families sluice serve exports that no panel
// shows, each with why. A new metric must be put on the dashboard or
// here.
var deliberatelyAbsent = map[string]string{
	// The Go runtime's and the process's collectors (client_golang's):
	// their families follow the Go and client_golang versions, and
	// Grafana's own Go and process dashboards show them better.
	"go_*":      "client_golang's Go collector",
	"process_*": "client_golang's process collector",
}

// listedAs reports whether name is the entry k of deliberatelyAbsent: k
// itself, or a family under k's prefix when k ends in *.
func listedAs(k, name string) bool {
	if p, ok := strings.CutSuffix(k, "*"); ok {
		return strings.HasPrefix(name, p)
	}
	return k == name
}

func absentOnPurpose(name string) bool {
	for k := range deliberatelyAbsent {
		if listedAs(k, name) {
			return true
		}
	}
	return false
}

// Every metric family sluice serve's /metrics can export, on the memory
// store, Redis and PostgreSQL (the registry serve builds, so a vector
// counts before it has a series: an adaptive limit's rate, a queue), is
// on a panel of the dashboard or listed in deliberatelyAbsent; and every
// metric the dashboard and the alerts read is one of them (or one
// Prometheus writes itself), so that a renamed metric does not leave a
// panel blank or an alert silent.
func TestDashboardShowsEveryMetric(t *testing.T) {
	used := monitoringMetrics(t)
	exported, from := everyExportedMetric(t)

	onDashboard := map[string]bool{}
	var problems []string
	for name, where := range used {
		if prometheusOwn[name] {
			continue
		}
		fam, ok := family(name, exported)
		if !ok {
			problems = append(problems, fmt.Sprintf("%s (read by %s) is exported on no store", name, strings.Join(where, ", ")))
			continue
		}
		for _, w := range where {
			if !strings.HasPrefix(w, "alert ") {
				onDashboard[fam] = true
			}
		}
	}
	for name := range exported {
		switch {
		case onDashboard[name] && absentOnPurpose(name):
			problems = append(problems, fmt.Sprintf("%s is on the dashboard and listed as deliberately absent", name))
		case !onDashboard[name] && !absentOnPurpose(name):
			problems = append(problems, fmt.Sprintf("%s, exported on %v, is on no panel of %s and not in deliberatelyAbsent", name, from[name], dashboardFile))
		}
	}
	for k := range deliberatelyAbsent {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(exported)), func(n string) bool { return listedAs(k, n) }) {
			problems = append(problems, fmt.Sprintf("deliberatelyAbsent lists %s, which no store exports", k))
		}
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
}
