package httpgate_test

import (
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/httpgate"
)

// TestOpenAPIMatchesTypes keeps api/openapi.yaml in step with the JSON the
// handlers speak.
func TestOpenAPIMatchesTypes(t *testing.T) {
	data, err := os.ReadFile("../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI    string                    `yaml:"openapi"`
		Paths      map[string]map[string]any `yaml:"paths"`
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi %q", doc.OpenAPI)
	}
	for path, method := range map[string]string{"/v1/take": "post", "/v1/peek": "post", "/v1/reset": "post", "/v1/settle": "post", "/v1/release": "post", "/v1/renew": "post", "/v1/auth": "get", "/healthz": "get", "/readyz": "get", "/metrics": "get", "/": "get", "/openapi.yaml": "get"} {
		if _, ok := doc.Paths[path][method]; !ok {
			t.Errorf("openapi lacks %s %s", method, path)
		}
	}
	for schema, v := range map[string]any{"Decision": httpgate.DecisionResponse{}, "Take": httpgate.TakeItem{}, "ResetRequest": httpgate.ResetRequest{}, "SettleRequest": httpgate.SettleRequest{}, "Settlement": httpgate.SettleResponse{}, "ReleaseRequest": httpgate.ReleaseRequest{}, "Release": httpgate.ReleaseResponse{}, "Renewal": httpgate.RenewResponse{}, "Problem": httpgate.Problem{}, "Index": httpgate.Index{}, "Endpoint": httpgate.Endpoint{}} {
		var fields, props []string
		rt := reflect.TypeOf(v)
		for i := 0; i < rt.NumField(); i++ {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			fields = append(fields, name)
		}
		for p := range doc.Components.Schemas[schema].Properties {
			props = append(props, p)
		}
		sort.Strings(fields)
		sort.Strings(props)
		if !reflect.DeepEqual(fields, props) {
			t.Errorf("schema %s has %v, the Go type %v", schema, props, fields)
		}
	}
}
