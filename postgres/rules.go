package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/policy"
)

// RuleRow is one row of sluice_rules.
type RuleRow struct {
	ID            int64
	KeyPattern    string
	Scope         string // user, endpoint, global or ip
	RatePerSecond float64
	Burst         int64
	Plan          string // "" for every plan (NULL)
	Active        bool
	Description   string
	CreatedAt     time.Time
}

// LoadRules reads the active rows of sluice_rules, grouped by key pattern
// with plan-specific rows before the NULL-plan row.
func LoadRules(ctx context.Context, db Queryer) ([]RuleRow, error) {
	rows, err := db.Query(ctx, `SELECT rule_id, key_pattern, scope, rate_per_second, burst_capacity,
       coalesce(plan, ''), is_active, coalesce(description, ''), created_at
FROM sluice_rules WHERE is_active
ORDER BY key_pattern, plan NULLS LAST, rule_id`)
	if err != nil {
		return nil, fmt.Errorf("postgres rules: %w", err)
	}
	out, err := pgx.AppendRows([]RuleRow(nil), rows, func(row pgx.CollectableRow) (r RuleRow, err error) {
		err = row.Scan(&r.ID, &r.KeyPattern, &r.Scope, &r.RatePerSecond, &r.Burst, &r.Plan, &r.Active, &r.Description, &r.CreatedAt)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres rules: %w", err)
	}
	return out, nil
}

// ForPlan returns the rows that apply to a request of plan ("" for none)
// when the config file's rules_table.default_plan is defaultPlan: for each
// key pattern its row for that plan if there is one, else its fallback
// row (see fallbackRow). A pattern with no fallback row, which
// CompilePolicy refuses, contributes nothing. rows must be grouped by key
// pattern, as LoadRules returns them.
func ForPlan(rows []RuleRow, plan, defaultPlan string) []RuleRow {
	var out []RuleRow
	for _, g := range ruleGroups(rows) {
		pick := fallbackRow(g, defaultPlan)
		for i := range g {
			if plan != "" && g[i].Plan == plan {
				pick = &g[i]
			}
		}
		if pick != nil {
			out = append(out, *pick)
		}
	}
	return out
}

// fallbackRow is the row of a key pattern that limits a request whose
// plan has no row of its own there (a request with no plan, or with a
// plan the pattern does not name): the row of defaultPlan, else the
// NULL-plan row; nil when there is neither, and such a request would
// escape the pattern.
func fallbackRow(group []RuleRow, defaultPlan string) *RuleRow {
	var null *RuleRow
	for i := range group {
		switch r := &group[i]; {
		case defaultPlan != "" && r.Plan == defaultPlan:
			return r
		case r.Plan == "":
			null = r
		}
	}
	return null
}

// RulesOptions says how table rows become policy rules. Where a request's
// plan and user come from is the config file's (policy.RulesTable).
type RulesOptions struct {
	// NamePrefix starts the name of every generated rule (default "db-").
	NamePrefix string
}

func (o *RulesOptions) defaults() {
	o.NamePrefix = cmp.Or(o.NamePrefix, "db-")
}

// allPlansTier names the tier of a NULL-plan row.
const allPlansTier = "all-plans"

var planName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,32}$`)

// ErrInvalidRule marks a sluice_rules row that cannot become a rule.
var ErrInvalidRule = errors.New("invalid rule row")

// policyRule is a rule of the config file schema, for generating YAML.
type policyRule struct {
	Name      string            `yaml:"name"`
	LimitKeys []string          `yaml:"limit_keys,omitempty"`
	Match     map[string]string `yaml:"match,omitempty"`
	Tiers     []policyTier      `yaml:"tiers"`
}

type policyTier struct {
	Name   string            `yaml:"name"`
	Match  map[string]string `yaml:"match,omitempty"`
	Config policyConfig      `yaml:"algorithm_config"`
}

type policyConfig struct {
	TokensPerSecond float64 `yaml:"tokens_per_second"`
	Burst           int64   `yaml:"burst"`
}

// RulesYAML converts rows (as LoadRules returns them) into policy rules in
// the config file's schema, a YAML list, reading plans and users from the
// sources of t: one token-bucket rule per key pattern, named NamePrefix +
// the smallest rule_id of the pattern, with one tier per plan matched on
// t.Plan and, last, the pattern's fallback row (the row of t.DefaultPlan,
// else the NULL-plan row), which takes every other request, so that no
// plan, however unknown, escapes the pattern. Without t.Plan no request
// has a plan and only the fallback row applies. The scope picks the
// bucket key: user -> t.User, ip -> ip:address, global -> one bucket,
// endpoint -> the path ("endpoint:/api/search" limits that path in one
// bucket, "endpoint:{path}" every path in its own).
func RulesYAML(rows []RuleRow, t policy.RulesTable, o RulesOptions) ([]byte, error) {
	out, _, err := generate(rows, t, o)
	if err != nil {
		return nil, err
	}
	return yaml.Marshal(out)
}

// generate makes the rules of RulesYAML, with a warning for each row that
// can apply to no request.
func generate(rows []RuleRow, t policy.RulesTable, o RulesOptions) ([]policyRule, []string, error) {
	o.defaults()
	var out []policyRule
	var warnings []string
	for _, g := range ruleGroups(rows) {
		r, w, err := groupRule(g, t, o)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, r)
		warnings = append(warnings, w...)
	}
	return out, warnings, nil
}

// RuleIDs maps the name of every limit RulesYAML makes of rows ("db-7.pro",
// "db-7.all-plans") to the sluice_rules row it came from, so that a
// violation of it can name its row (ViolationLog.SetRuleIDs).
func RuleIDs(rows []RuleRow, o RulesOptions) map[string]int64 {
	o.defaults()
	ids := make(map[string]int64, len(rows))
	for _, g := range ruleGroups(rows) {
		name := groupName(g, o)
		for _, r := range g {
			ids[name+"."+tierName(r)] = r.ID
		}
	}
	return ids
}

// ruleGroups splits rows, grouped by key pattern as LoadRules returns
// them, into one slice per pattern: one generated rule each.
func ruleGroups(rows []RuleRow) [][]RuleRow {
	var gs [][]RuleRow
	for i := 0; i < len(rows); {
		j := i
		for j < len(rows) && rows[j].KeyPattern == rows[i].KeyPattern {
			j++
		}
		gs = append(gs, rows[i:j])
		i = j
	}
	return gs
}

// groupName is the name of a pattern's rule: NamePrefix and the smallest
// rule_id of its rows, which stays while plans are added and removed.
func groupName(group []RuleRow, o RulesOptions) string {
	first := slices.MinFunc(group, func(a, b RuleRow) int { return cmp.Compare(a.ID, b.ID) })
	return o.NamePrefix + strconv.FormatInt(first.ID, 10)
}

// tierName is the tier a row becomes: its plan, or allPlansTier for the
// NULL-plan row.
func tierName(r RuleRow) string {
	if r.Plan == "" {
		return allPlansTier
	}
	return r.Plan
}

func groupRule(group []RuleRow, t policy.RulesTable, o RulesOptions) (policyRule, []string, error) {
	first := group[0]
	where := func(r RuleRow) string { return fmt.Sprintf("sluice_rules rule_id %d (%q)", r.ID, r.KeyPattern) }
	bad := func(r RuleRow, format string, a ...any) (policyRule, []string, error) {
		return policyRule{}, nil, fmt.Errorf("%w: %s: %s", ErrInvalidRule, where(r), fmt.Sprintf(format, a...))
	}
	for _, r := range group {
		if r.Scope != first.Scope {
			return bad(r, "scope %q differs from the scope %q of rule_id %d with the same key_pattern", r.Scope, first.Scope, first.ID)
		}
		if math.IsNaN(r.RatePerSecond) || math.IsInf(r.RatePerSecond, 0) || r.RatePerSecond <= 0 {
			return bad(r, "rate_per_second must be a finite number > 0, got %v", r.RatePerSecond)
		}
		if r.Burst < 1 {
			return bad(r, "burst_capacity must be >= 1, got %d", r.Burst)
		}
		if r.Plan != "" && (!planName.MatchString(r.Plan) || r.Plan == allPlansTier) {
			return bad(r, "plan %q must be 1 to 32 of A-Z a-z 0-9 _ . - (and not %q)", r.Plan, allPlansTier)
		}
	}
	pr := policyRule{Name: groupName(group, o)}
	switch first.Scope {
	case "user":
		if t.User == "" {
			return bad(first, "scope user needs to know who the user is, and no source is trusted: set rules_table.user in the config file (a jwt section makes jwt:sub the default; or ip:address, or a header:NAME that the proxy in front sets)")
		}
		pr.LimitKeys = []string{t.User}
	case "ip":
		pr.LimitKeys = []string{"ip:address"}
	case "global":
	case "endpoint":
		path, ok := strings.CutPrefix(first.KeyPattern, "endpoint:")
		switch {
		case !ok:
			return bad(first, `an endpoint rule's key_pattern is "endpoint:/path" or "endpoint:{path}"`)
		case strings.HasPrefix(path, "{") && strings.HasSuffix(path, "}"):
			pr.LimitKeys = []string{"path"}
		case strings.HasPrefix(path, "/"):
			pr.Match = map[string]string{"path": path}
		default:
			return bad(first, "the endpoint %q must start with /", path)
		}
	default:
		return bad(first, "unknown scope %q (want user, endpoint, global or ip)", first.Scope)
	}

	fallback := fallbackRow(group, t.DefaultPlan)
	switch {
	case fallback == nil && t.DefaultPlan != "":
		return bad(first, "the key_pattern has neither a NULL-plan row nor a row for rules_table.default_plan %q, so a request of any other plan would not be limited by it; add one of them", t.DefaultPlan)
	case fallback == nil:
		return bad(first, "the key_pattern has no NULL-plan row, so a request of any other plan would not be limited by it; add a NULL-plan row, or set rules_table.default_plan in the config file to a plan it has a row for")
	}
	var warnings []string
	for i, r := range group {
		switch {
		case &group[i] == fallback:
			continue // the last tier, below
		case r.Plan == "":
			warnings = append(warnings, fmt.Sprintf("%s: the NULL-plan row applies to no request: the row of rules_table.default_plan %q takes every request without a row of its own", where(r), t.DefaultPlan))
		case t.Plan == "":
			warnings = append(warnings, fmt.Sprintf("%s: the row of plan %q applies to no request: no source of plans is trusted (set rules_table.plan in the config file, or add a jwt section for jwt:plan)", where(r), r.Plan))
		default:
			pr.Tiers = append(pr.Tiers, tierOf(r, map[string]string{t.Plan: r.Plan}))
		}
	}
	pr.Tiers = append(pr.Tiers, tierOf(*fallback, nil))
	return pr, warnings, nil
}

// tierOf is the tier a row becomes, matched by match (nil: every request).
func tierOf(r RuleRow, match map[string]string) policyTier {
	return policyTier{Name: tierName(r), Match: match, Config: policyConfig{TokensPerSecond: r.RatePerSecond, Burst: r.Burst}}
}

// CompilePolicy compiles the config file base (named filename; nil for
// none) together with the rules of rows into one policy, the rows' rules
// after the file's, their plans and users read from the sources of the
// file's rules_table section (policy.RulesTableOf). An invalid row, or a
// generated rule the policy refuses (a name taken by the file, a burst
// below the rate, a user row with no source of users), is an error: the
// caller keeps its previous policy. Rows that can apply to no request
// are named in the policy's Warnings.
func CompilePolicy(filename string, base []byte, rows []RuleRow, o RulesOptions) (*policy.Policy, error) {
	p, _, err := compile(filename, base, rows, o)
	return p, err
}

// compile is CompilePolicy, also returning the warnings about rows.
func compile(filename string, base []byte, rows []RuleRow, o RulesOptions) (*policy.Policy, []string, error) {
	ids, err := policy.RulesTableOf(filename, base)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres rules: %w", err)
	}
	rules, warnings, err := generate(rows, ids, o)
	if err != nil {
		return nil, nil, err
	}
	gen, err := yaml.Marshal(rules)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres rules: %w", err)
	}
	var genNode yaml.Node
	if err := yaml.Unmarshal(gen, &genNode); err != nil {
		return nil, nil, fmt.Errorf("postgres rules: %w", err)
	}
	var doc yaml.Node
	if len(base) > 0 {
		if err := yaml.Unmarshal(base, &doc); err != nil {
			return nil, nil, fmt.Errorf("postgres rules: %s: %w", filename, err)
		}
	}
	if doc.Kind == 0 {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, nil, fmt.Errorf("postgres rules: %s: the top level must be a mapping", filename)
	}
	var list *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "rules" {
			list = root.Content[i+1]
		}
	}
	if list == nil {
		list = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "rules"}, list)
	}
	if list.Kind != yaml.SequenceNode {
		return nil, nil, fmt.Errorf("postgres rules: %s: rules must be a list", filename)
	}
	if len(genNode.Content) > 0 && genNode.Content[0].Kind == yaml.SequenceNode {
		list.Content = append(list.Content, genNode.Content[0].Content...)
	}
	merged, err := yaml.Marshal(&doc)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres rules: %w", err)
	}
	name := cmp.Or(filename, "sluice_rules")
	p, err := policy.Parse(name+" + sluice_rules", merged)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres rules: %w", err)
	}
	p.Warnings = append(p.Warnings, warnings...)
	return p, warnings, nil
}
