package httpgate_test

import (
	"os"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func signHS256(t *testing.T, secret string, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTiersWithJWT runs examples/tiered.yaml through forward auth: a caller
// whose verified token says plan: enterprise is limited only by the
// enterprise tier, everyone else (including bearers of forged or expired
// tokens) only by the free tier.
func TestTiersWithJWT(t *testing.T) {
	const secret = "test-secret-0123456789abcdef0123456789"
	t.Setenv("SLUICE_JWT_SECRET", secret)
	cfg, err := os.ReadFile("../examples/tiered.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, string(cfg))
	exp := time.Now().Add(time.Hour).Unix()
	enterprise := signHS256(t, secret, jwt.MapClaims{"sub": "acme", "plan": "enterprise", "exp": exp})
	forged := signHS256(t, "another-secret-0123456789abcdef012345", jwt.MapClaims{"sub": "mallory", "plan": "enterprise", "exp": exp})
	expired := signHS256(t, secret, jwt.MapClaims{"sub": "old", "plan": "enterprise", "exp": time.Now().Add(-time.Hour).Unix()})
	free := signHS256(t, secret, jwt.MapClaims{"sub": "bob", "plan": "free", "exp": exp})

	auth := func(key, token string) (int, string, string) {
		resp, _ := e.get("/v1/auth", "X-Api-Key", key, "Authorization", "Bearer "+token)
		return resp.StatusCode, resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit")
	}

	// Enterprise: 2000 burst, far past the free tier's 20.
	for i := 0; i < 30; i++ {
		code, pol, _ := auth("k-ent", enterprise)
		if code != 200 || pol != `"api-key.enterprise";q=2000;w=2` {
			t.Fatalf("enterprise request %d: %d %q", i, code, pol)
		}
	}
	if _, _, rl := auth("k-ent", enterprise); rl != `"api-key.enterprise";r=1969;t=1` {
		t.Errorf("enterprise RateLimit %q", rl)
	}

	for name, tok := range map[string]string{"free": free, "forged": forged, "expired": expired, "garbage": "not.a.jwt"} {
		t.Run(name, func(t *testing.T) {
			key := "k-" + name
			for i := 0; i < 20; i++ {
				code, pol, _ := auth(key, tok)
				if code != 200 || pol != `"api-key.free";q=20;w=2` {
					t.Fatalf("request %d: %d %q", i, code, pol)
				}
			}
			code, _, rl := auth(key, tok)
			if code != 429 || rl != `"api-key.free";r=0;t=1` {
				t.Errorf("21st request: %d %q", code, rl)
			}
		})
	}
}
