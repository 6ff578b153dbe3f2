package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

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
	defer rows.Close()
	var out []RuleRow
	for rows.Next() {
		var r RuleRow
		if err := rows.Scan(&r.ID, &r.KeyPattern, &r.Scope, &r.RatePerSecond, &r.Burst, &r.Plan, &r.Active, &r.Description, &r.CreatedAt); err != nil {
			return nil, fmt.Errorf("postgres rules: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres rules: %w", err)
	}
	return out, nil
}

// ForPlan returns the rows that apply to a request of plan: for each key
// pattern its row for that plan if there is one, else its NULL-plan row.
// rows must be grouped by key pattern, as LoadRules returns them.
func ForPlan(rows []RuleRow, plan string) []RuleRow {
	var out []RuleRow
	for i := 0; i < len(rows); {
		j := i
		var pick *RuleRow
		for ; j < len(rows) && rows[j].KeyPattern == rows[i].KeyPattern; j++ {
			r := &rows[j]
			switch {
			case plan != "" && r.Plan == plan:
				pick = r
			case r.Plan == "" && (pick == nil || pick.Plan != plan):
				pick = r
			}
		}
		if pick != nil {
			out = append(out, *pick)
		}
		i = j
	}
	return out
}

// RulesOptions says how table rows become policy rules.
type RulesOptions struct {
	// UserKey is the limit_keys source identifying the user of a "user"
	// scope rule (default "header:X-User-ID"; "jwt:sub" needs the config
	// file's jwt section).
	UserKey string
	// PlanKey is the match source carrying a request's plan (default
	// "header:X-Plan").
	PlanKey string
	// NamePrefix starts the name of every generated rule (default "db-").
	NamePrefix string
}

func (o *RulesOptions) defaults() {
	if o.UserKey == "" {
		o.UserKey = "header:X-User-ID"
	}
	if o.PlanKey == "" {
		o.PlanKey = "header:X-Plan"
	}
	if o.NamePrefix == "" {
		o.NamePrefix = "db-"
	}
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
// the config file's schema, a YAML list: one token-bucket rule per key
// pattern, named NamePrefix + the smallest rule_id of the pattern, with
// one tier per plan matched on PlanKey and the NULL-plan row as the last
// tier, which takes every other request. The scope picks the bucket key:
// user -> UserKey, ip -> ip:address, global -> one bucket,
// endpoint -> the path ("endpoint:/api/search" limits that path in one
// bucket, "endpoint:{path}" every path in its own).
func RulesYAML(rows []RuleRow, o RulesOptions) ([]byte, error) {
	o.defaults()
	var out []policyRule
	for _, g := range ruleGroups(rows) {
		r, err := groupRule(g, o)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return yaml.Marshal(out)
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
	minID := group[0].ID
	for _, r := range group {
		minID = min(minID, r.ID)
	}
	return o.NamePrefix + strconv.FormatInt(minID, 10)
}

// tierName is the tier a row becomes: its plan, or allPlansTier for the
// NULL-plan row.
func tierName(r RuleRow) string {
	if r.Plan == "" {
		return allPlansTier
	}
	return r.Plan
}

func groupRule(group []RuleRow, o RulesOptions) (policyRule, error) {
	first := group[0]
	bad := func(r RuleRow, format string, a ...any) error {
		return fmt.Errorf("%w: sluice_rules rule_id %d (%q): %s", ErrInvalidRule, r.ID, r.KeyPattern, fmt.Sprintf(format, a...))
	}
	var plans, all []policyTier
	for _, r := range group {
		if r.Scope != first.Scope {
			return policyRule{}, bad(r, "scope %q differs from the scope %q of rule_id %d with the same key_pattern", r.Scope, first.Scope, first.ID)
		}
		if math.IsNaN(r.RatePerSecond) || math.IsInf(r.RatePerSecond, 0) || r.RatePerSecond <= 0 {
			return policyRule{}, bad(r, "rate_per_second must be a finite number > 0, got %v", r.RatePerSecond)
		}
		if r.Burst < 1 {
			return policyRule{}, bad(r, "burst_capacity must be >= 1, got %d", r.Burst)
		}
		t := policyTier{Name: tierName(r), Config: policyConfig{TokensPerSecond: r.RatePerSecond, Burst: r.Burst}}
		if r.Plan == "" {
			all = append(all, t)
			continue
		}
		if !planName.MatchString(r.Plan) || r.Plan == allPlansTier {
			return policyRule{}, bad(r, "plan %q must be 1 to 32 of A-Z a-z 0-9 _ . - (and not %q)", r.Plan, allPlansTier)
		}
		t.Match = map[string]string{o.PlanKey: r.Plan}
		plans = append(plans, t)
	}
	pr := policyRule{Name: groupName(group, o), Tiers: append(plans, all...)}
	switch first.Scope {
	case "user":
		pr.LimitKeys = []string{o.UserKey}
	case "ip":
		pr.LimitKeys = []string{"ip:address"}
	case "global":
	case "endpoint":
		path, ok := strings.CutPrefix(first.KeyPattern, "endpoint:")
		switch {
		case !ok:
			return policyRule{}, bad(first, `an endpoint rule's key_pattern is "endpoint:/path" or "endpoint:{path}"`)
		case strings.HasPrefix(path, "{") && strings.HasSuffix(path, "}"):
			pr.LimitKeys = []string{"path"}
		case strings.HasPrefix(path, "/"):
			pr.Match = map[string]string{"path": path}
		default:
			return policyRule{}, bad(first, "the endpoint %q must start with /", path)
		}
	default:
		return policyRule{}, bad(first, "unknown scope %q (want user, endpoint, global or ip)", first.Scope)
	}
	return pr, nil
}

// CompilePolicy compiles the config file base (named filename; nil for
// none) together with the rules of rows into one policy, the rows' rules
// after the file's. An invalid row, or a generated rule the policy refuses
// (a name taken by the file, a burst below the rate), is an error: the
// caller keeps its previous policy.
func CompilePolicy(filename string, base []byte, rows []RuleRow, o RulesOptions) (*policy.Policy, error) {
	gen, err := RulesYAML(rows, o)
	if err != nil {
		return nil, err
	}
	var genNode yaml.Node
	if err := yaml.Unmarshal(gen, &genNode); err != nil {
		return nil, fmt.Errorf("postgres rules: %w", err)
	}
	var doc yaml.Node
	if len(base) > 0 {
		if err := yaml.Unmarshal(base, &doc); err != nil {
			return nil, fmt.Errorf("postgres rules: %s: %w", filename, err)
		}
	}
	if doc.Kind == 0 {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("postgres rules: %s: the top level must be a mapping", filename)
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
		return nil, fmt.Errorf("postgres rules: %s: rules must be a list", filename)
	}
	if len(genNode.Content) > 0 && genNode.Content[0].Kind == yaml.SequenceNode {
		list.Content = append(list.Content, genNode.Content[0].Content...)
	}
	merged, err := yaml.Marshal(&doc)
	if err != nil {
		return nil, fmt.Errorf("postgres rules: %w", err)
	}
	name := filename
	if name == "" {
		name = "sluice_rules"
	}
	p, err := policy.Parse(name+" + sluice_rules", merged)
	if err != nil {
		return nil, fmt.Errorf("postgres rules: %w", err)
	}
	return p, nil
}
