package policy

// The generic plumbing of the loader: reading YAML nodes into typed
// values, and reporting problems located as FILE:LINE: path. Nothing here
// knows the schema; load.go and the section loaders do.

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

func (l *loader) errf(n *yaml.Node, path, format string, args ...any) {
	l.errs = append(l.errs, l.at(n, path, format, args...))
}

// warnf records a warning: the file loads, but the setting deserves a
// second look.
func (l *loader) warnf(n *yaml.Node, path, format string, args ...any) {
	l.warns = append(l.warns, l.at(n, path, format, args...))
}

func (l *loader) at(n *yaml.Node, path, format string, args ...any) *Error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &Error{File: l.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)}
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func (l *loader) syntaxError(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		l.errs = append(l.errs, &Error{File: l.file, Line: line, Msg: "syntax error: " + m[2]})
		return
	}
	l.errs = append(l.errs, &Error{File: l.file, Msg: "syntax error: " + msg})
}

// obj is a mapping node whose keys have been checked against the fields
// its schema allows.
type obj struct {
	l    *loader
	n    *yaml.Node
	path string
	vals map[string]*yaml.Node
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// deref follows aliases (bounded, since an alias cannot refer to itself).
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 64; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// object checks that n is a mapping whose keys are all in allowed (nil
// allows any key) and unique. It returns nil when n is not a mapping.
func (l *loader) object(n *yaml.Node, path string, allowed []string) *obj {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		l.errf(n, path, "must be a mapping of fields (got %s)", kindName(n))
		return nil
	}
	o := &obj{l: l, n: n, path: path, vals: map[string]*yaml.Node{}}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			l.errf(k, path, "field names must be plain strings")
			continue
		}
		name := k.Value
		if _, dup := o.vals[name]; dup {
			l.errf(k, join(path, name), "appears twice")
			continue
		}
		if allowed != nil && !slices.Contains(allowed, name) {
			msg := "unknown field"
			if s := Suggest(name, allowed); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			} else {
				msg += " (known: " + strings.Join(allowed, ", ") + ")"
			}
			l.errf(k, join(path, name), "%s", msg)
			continue
		}
		o.vals[name] = v
	}
	return o
}

// has reports whether the mapping sets field name (validly or not).
func (o *obj) has(name string) bool { _, ok := o.vals[name]; return ok }

func (o *obj) str(name string) (string, *yaml.Node, bool) {
	n, ok := o.vals[name]
	if !ok {
		return "", nil, false
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		o.l.errf(n, join(o.path, name), "must be a string (got %s)", kindName(n))
		return "", n, false
	}
	return n.Value, n, true
}

func (o *obj) num(name string) (float64, *yaml.Node, bool) {
	n, ok := o.vals[name]
	if !ok {
		return 0, nil, false
	}
	f, ok := o.l.number(n, join(o.path, name))
	return f, n, ok
}

// positive reads a number that must be > 0.
func (o *obj) positive(name string) (float64, *yaml.Node, bool) {
	v, vn, ok := o.num(name)
	if ok && v <= 0 {
		o.l.errf(vn, join(o.path, name), "must be > 0 (got %v)", v)
		return 0, vn, false
	}
	return v, vn, ok
}

func (l *loader) number(n *yaml.Node, path string) (float64, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		l.errf(n, path, "must be a number (got %s)", kindName(n))
		return 0, false
	}
	var f float64
	if err := n.Decode(&f); err != nil {
		l.errf(n, path, "must be a number: %v", err)
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		l.errf(n, path, "must be a finite number")
		return 0, false
	}
	return f, true
}

func (o *obj) integer(name string) (int, *yaml.Node, bool) {
	f, n, ok := o.num(name)
	if !ok {
		return 0, n, false
	}
	if f != math.Trunc(f) || math.Abs(f) > 1<<31 {
		o.l.errf(n, join(o.path, name), "must be a whole number")
		return 0, n, false
	}
	return int(f), n, true
}

// either reads a setting of two values, names[0] the zero one, into *dst.
func either[T ~uint8](o *obj, name string, names [2]string, dst *T) {
	v, n, ok := o.str(name)
	if !ok {
		return
	}
	i := slices.Index(names[:], v)
	if i < 0 {
		o.l.errf(n, join(o.path, name), "must be %s or %s (got %q)", names[0], names[1], v)
		return
	}
	*dst = T(i)
}

// intIn reads a whole number from lo to hi into *dst.
func (o *obj) intIn(name string, lo, hi int, dst *int) {
	if v, n, ok := o.integer(name); ok {
		if v < lo || v > hi {
			o.l.errf(n, join(o.path, name), "must be between %d and %d (got %d)", lo, hi, v)
		} else {
			*dst = v
		}
	}
}

func (o *obj) boolean(name string) (bool, *yaml.Node, bool) {
	n, ok := o.vals[name]
	if !ok {
		return false, nil, false
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		o.l.errf(n, join(o.path, name), "must be true or false (got %s)", kindName(n))
		return false, n, false
	}
	var b bool
	if err := n.Decode(&b); err != nil {
		o.l.errf(n, join(o.path, name), "must be true or false")
		return false, n, false
	}
	return b, n, true
}

func (o *obj) duration(name string) (time.Duration, *yaml.Node, bool) {
	if n, ok := o.vals[name]; ok && n.Kind == yaml.ScalarNode && (n.Tag == "!!int" || n.Tag == "!!float") {
		o.l.errf(n, join(o.path, name), "must be a duration with a unit, such as \"%ss\" (got the number %s)", n.Value, n.Value)
		return 0, n, false
	}
	s, n, ok := o.str(name)
	if !ok {
		return 0, n, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		o.l.errf(n, join(o.path, name), "must be a duration such as \"1m\" or \"500ms\" (got %q)", s)
		return 0, n, false
	}
	return d, n, true
}

// positiveDuration reads a duration that must be > 0 into *dst; why, if
// any, follows the error.
func (o *obj) positiveDuration(name, why string, dst *time.Duration) {
	d, n, ok := o.duration(name)
	switch {
	case !ok:
	case d <= 0:
		o.l.errf(n, join(o.path, name), "must be > 0 (got %q)%s", n.Value, why)
	default:
		*dst = d
	}
}

// list returns the items of a sequence field.
func (o *obj) list(name string) ([]*yaml.Node, *yaml.Node, bool) {
	n, ok := o.vals[name]
	if !ok {
		return nil, nil, false
	}
	if n.Kind != yaml.SequenceNode {
		o.l.errf(n, join(o.path, name), "must be a list (got %s)", kindName(n))
		return nil, n, false
	}
	items := make([]*yaml.Node, len(n.Content))
	for i, it := range n.Content {
		items[i] = deref(it)
	}
	return items, n, true
}

// strings returns a list of strings; bad items are reported and skipped.
func (o *obj) strList(name string) ([]string, []*yaml.Node, bool) {
	items, _, ok := o.list(name)
	if !ok {
		return nil, nil, false
	}
	var out []string
	var nodes []*yaml.Node
	for i, it := range items {
		if it.Kind != yaml.ScalarNode || it.Tag != "!!str" {
			o.l.errf(it, fmt.Sprintf("%s[%d]", join(o.path, name), i), "must be a string (got %s)", kindName(it))
			continue
		}
		out = append(out, it.Value)
		nodes = append(nodes, it)
	}
	return out, nodes, true
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "nothing"
		case "!!str":
			return fmt.Sprintf("the string %q", clip(n.Value))
		case "!!int", "!!float":
			return "the number " + clip(n.Value)
		case "!!bool":
			return n.Value
		}
		return clip(n.Value)
	}
	return "an unsupported value"
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// Suggest returns the candidate closest to name, ignoring case, when it
// is within an edit distance of 2; else "". Every "did you mean" of
// sluice uses it.
func Suggest(name string, candidates []string) string {
	best, bestD := "", 3
	name = strings.ToLower(name)
	for _, a := range candidates {
		// The distance is at least the difference in length: most
		// candidates are ruled out without the quadratic comparison.
		if d := len(a) - len(name); max(d, -d) >= bestD {
			continue
		}
		// A short name is a few edits from every other short name.
		if d := editDistance(name, strings.ToLower(a)); d < bestD && d < len(name) {
			best, bestD = a, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// orList joins names as "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}
