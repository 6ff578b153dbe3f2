package jwtauth_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/jwtauth"
)

func TestBearerToken(t *testing.T) {
	for auth, want := range map[string]string{
		"Bearer abc":                            "abc",
		"bearer abc":                            "abc",
		"BEARER  abc ":                          "abc",
		"Bearer":                                "",
		"Bearerabc":                             "",
		"Basic abc":                             "",
		"":                                      "",
		"Bearer " + strings.Repeat("a", 20<<10): "",
	} {
		h := http.Header{}
		if auth != "" {
			h.Set("Authorization", auth)
		}
		if got := jwtauth.BearerToken(h); got != want {
			t.Errorf("%.20q: %q, want %q", auth, got, want)
		}
	}
}
