package settle_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/settle"
)

// An actual cost is read from a header or a JSON body: a finite number
// >= 0; a field or key given more than once counts its largest value.
func TestSourceReads(t *testing.T) {
	h := &settle.Source{Kind: settle.Header, Name: "X-Usage"}
	for vals, want := range map[string]float64{"12": 12, " 7.5 ": 7.5, "0": 0, "3|9|x": 9, "x": -1, "-1": -1, "NaN": -1, "Inf": -1, "": -1} {
		hdr := http.Header{}
		for _, v := range strings.Split(vals, "|") {
			if vals != "" {
				hdr.Add("X-Usage", v)
			}
		}
		got, ok := h.FromHeader(hdr)
		if (want < 0) == ok || (ok && got != want) {
			t.Errorf("header %q: %v %v, want %v", vals, got, ok, want)
		}
	}
	b := &settle.Source{Kind: settle.Body, Path: []string{"usage", "total_tokens"}}
	for doc, want := range map[string]float64{
		`{"usage":{"total_tokens":42}}`: 42,
		`{"id":"x","choices":[{"usage":{"total_tokens":1}}],"usage":{"prompt_tokens":3,"total_tokens":12}}`: 12,
		`{"usage":null}`:                                           -1,
		`{"usage":{"total_tokens":"42"}}`:                          -1,
		`{"usage":{"total_tokens":42}`:                             -1,
		`{"usage":{"total_tokens":4},"usage":{"total_tokens":40}}`: 40,
		`{"usage":{"total_tokens":-4}}`:                            -1,
		`[]`:                                                       -1,
	} {
		got, ok := b.FromJSON([]byte(doc))
		if (want < 0) == ok || (ok && got != want) {
			t.Errorf("body %s: %v %v, want %v", doc, got, ok, want)
		}
	}
}
