package policy

import (
	"slices"

	"gopkg.in/yaml.v3"
)

// RulesTableOf reads the rules_table section of a configuration as Parse
// does (defaults included), checking nothing else: the PostgreSQL rules
// table needs the identities before its rows can join the file's rules.
// A nil data is a file without the section and without a jwt section.
func RulesTableOf(filename string, data []byte) (RulesTable, error) {
	l := &loader{file: filename}
	var t RulesTable
	if len(data) == 0 {
		return t, nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		l.syntaxError(err)
	} else if len(doc.Content) > 0 {
		if o := l.object(doc.Content[0], "", nil); o != nil {
			t = l.rulesTable(o, true) // warnings are Parse's to give
			if !o.has("jwt") {
				l.needJWT()
			}
		}
	}
	if len(l.errs) > 0 {
		es := &Errors{}
		for _, e := range l.errs {
			es.List = append(es.List, e)
		}
		return RulesTable{}, es
	}
	return t, nil
}

var rulesTableFields = []string{"plan", "user", "default_plan"}

// rulesTable reads the rules_table section of top. trusted says whether
// trusted_proxies are configured: without them, a plan or user read from
// the request itself is whatever the client sends, which is warned about.
func (l *loader) rulesTable(top *obj, trusted bool) RulesTable {
	var t RulesTable
	if top.has("jwt") {
		t.Plan, t.User = "jwt:plan", "jwt:sub"
	}
	n, ok := top.vals["rules_table"]
	if !ok {
		return t
	}
	o := l.object(n, "rules_table", rulesTableFields)
	if o == nil {
		return t
	}
	for _, f := range []struct {
		field string
		dst   *string
		kinds []sourceKind
		want  string
	}{
		{"plan", &t.Plan, []sourceKind{srcJWT, srcHeader, srcQuery, srcDescriptorKey}, "jwt:CLAIM, header:NAME, query:NAME or descriptor:KEY"},
		{"user", &t.User, []sourceKind{srcJWT, srcHeader, srcQuery, srcDescriptorKey, srcIP}, "jwt:CLAIM, ip:address, header:NAME, query:NAME or descriptor:KEY"},
	} {
		v, vn, ok := o.str(f.field)
		if !ok {
			continue
		}
		path := join("rules_table", f.field)
		src, msg := parseSource(v, false)
		if msg != "" || !slices.Contains(f.kinds, src.kind) {
			l.errf(vn, path, "must be %s (got %q)", f.want, v)
			continue
		}
		l.noteJWT(src, vn, path)
		l.warnAddressHeader(src, vn, path)
		*f.dst = v
		if (src.kind == srcHeader || src.kind == srcQuery) && !trusted {
			l.warnf(vn, path, "%s is whatever the client sends and no trusted_proxies are configured, so nothing in front sets or strips it: any client can pick its %s (read it from a verified claim, jwt:CLAIM, or have the proxy in front set it on every request and list that proxy in trusted_proxies)", v, f.field)
		}
	}
	if v, vn, ok := o.str("default_plan"); ok {
		if !validName(v) {
			l.errf(vn, "rules_table.default_plan", "%q must be 1 to 64 of A-Z a-z 0-9 _ . -", v)
		} else {
			t.DefaultPlan = v
		}
	}
	return t
}
