package policy_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

// TestUISettings reads the ui section: keys shown by default, hashed
// with show_keys: false, and a warning when the page has no admin token
// to open it.
func TestUISettings(t *testing.T) {
	body := "rules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"
	for _, tc := range []struct {
		name, cfg string
		show      bool
		warnings  []string
	}{
		{"default", body, true, nil},
		{"hashed", "admin_token_env: T\nui: {show_keys: false}\n" + body, false, nil},
		{"shown", "admin_token_env: T\nui:\n  show_keys: true\n" + body, true, nil},
		{"no admin token", "ui: {show_keys: false}\n" + body, false, []string{
			"c.yaml:1: ui: the live page (/ui, /v1/stats) needs the admin token: without admin_token_env it is disabled",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse("c.yaml", []byte(tc.cfg))
			if err != nil {
				t.Fatal(err)
			}
			if p.Settings.UI.ShowKeys != tc.show {
				t.Errorf("ShowKeys %v, want %v", p.Settings.UI.ShowKeys, tc.show)
			}
			if strings.Join(p.Warnings, "\n") != strings.Join(tc.warnings, "\n") {
				t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(p.Warnings, "\n"), strings.Join(tc.warnings, "\n"))
			}
		})
	}
	for cfg, want := range map[string]string{
		"ui: {show_key: false}\n" + body:   `c.yaml:1: ui.show_key: unknown field (did you mean "show_keys"?)`,
		"ui: {show_keys: \"no\"}\n" + body: "c.yaml:1: ui.show_keys: must be true or false (got the string \"no\")",
		"ui: [show_keys]\n" + body:         "c.yaml:1: ui: must be a mapping of fields (got a list)",
		"ui:\n  show_keys: 1\n" + body:     "c.yaml:2: ui.show_keys: must be true or false (got the number 1)",
	} {
		_, err := policy.Parse("c.yaml", []byte(cfg))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %s", cfg, err, want)
		}
	}
}
