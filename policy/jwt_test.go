package policy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sluicehq/sluice/policy"
)

var (
	keysOnce sync.Once
	rsaKey   *rsa.PrivateKey
	ecKey    *ecdsa.PrivateKey
)

func testKeys(t testing.TB) (*rsa.PrivateKey, *ecdsa.PrivateKey) {
	keysOnce.Do(func() {
		var err error
		if rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if ecKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
	})
	return rsaKey, ecKey
}

func sign(t testing.TB, m jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	tok.Header["kid"] = "k1"
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func testJWKS(t testing.TB) string {
	rk, ek := testKeys(t)
	set := map[string]any{"keys": []map[string]string{
		{"kty": "RSA", "kid": "k1", "use": "sig", "n": b64(rk.N.Bytes()), "e": b64(big.NewInt(int64(rk.E)).Bytes())},
		{"kty": "EC", "kid": "k1", "crv": "P-256", "x": b64(ek.X.FillBytes(make([]byte, 32))), "y": b64(ek.Y.FillBytes(make([]byte, 32)))},
		{"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
	}}
	b, _ := json.Marshal(set)
	return string(b)
}

// planOf matches a request carrying token against a one-rule tiered
// policy and returns the limit applied.
func limitFor(t *testing.T, p *policy.Policy, token string) string {
	t.Helper()
	h := http.Header{"X-Api-Key": {"k-1"}}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	ms, err := p.Match(&policy.Input{Method: "GET", Path: "/", Header: h})
	if err != nil || len(ms) != 1 {
		t.Fatalf("matches %v, err %v", ms, err)
	}
	return ms[0].Request.Limit.Name()
}

const tieredCfg = `
rules:
  - name: api-key
    limit_keys: ["header:x-api-key"]
    tiers:
      - name: enterprise
        match: { "jwt:plan": enterprise }
        algorithm_config: { rps: 1000, burst: 2000 }
      - name: free
        algorithm_config: { rps: 10, burst: 20 }
`

func TestJWTHMAC(t *testing.T) {
	t.Setenv("JWT_SECRET", testSecret)
	p := mustParse(t, "jwt:\n  hmac_secret_env: JWT_SECRET\n  issuer: auth\n  audience: api\n"+tieredCfg)
	now := time.Now()
	good := jwt.MapClaims{"plan": "enterprise", "sub": "u1", "iss": "auth", "aud": "api", "exp": now.Add(time.Hour).Unix()}
	with := func(k string, v any) jwt.MapClaims {
		c := jwt.MapClaims{}
		for a, b := range good {
			c[a] = b
		}
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	rk, _ := testKeys(t)
	cases := []struct {
		name, token, want string
	}{
		{"verified enterprise", sign(t, jwt.SigningMethodHS256, []byte(testSecret), good), "api-key.enterprise"},
		{"HS512", sign(t, jwt.SigningMethodHS512, []byte(testSecret), good), "api-key.enterprise"},
		{"forged with another secret", sign(t, jwt.SigningMethodHS256, []byte("another-secret-of-enough-length-0123456789"), good), "api-key.free"},
		{"alg none", sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, good), "api-key.free"},
		{"RS256 with no RSA key configured", sign(t, jwt.SigningMethodRS256, rk, good), "api-key.free"},
		{"expired", sign(t, jwt.SigningMethodHS256, []byte(testSecret), with("exp", now.Add(-time.Hour).Unix())), "api-key.free"},
		{"not yet valid", sign(t, jwt.SigningMethodHS256, []byte(testSecret), with("nbf", now.Add(time.Hour).Unix())), "api-key.free"},
		{"wrong issuer", sign(t, jwt.SigningMethodHS256, []byte(testSecret), with("iss", "evil")), "api-key.free"},
		{"wrong audience", sign(t, jwt.SigningMethodHS256, []byte(testSecret), with("aud", "other")), "api-key.free"},
		{"free plan", sign(t, jwt.SigningMethodHS256, []byte(testSecret), with("plan", "free")), "api-key.free"},
		{"no token", "", "api-key.free"},
		{"garbage", "not.a.token", "api-key.free"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := limitFor(t, p, tc.token); got != tc.want {
				t.Fatalf("limit %q, want %q", got, tc.want)
			}
		})
	}
	// A tampered payload with the original signature.
	tok := sign(t, jwt.SigningMethodHS256, []byte(testSecret), with("plan", "free"))
	parts := splitDots(tok)
	forgedPayload, _ := json.Marshal(good)
	if got := limitFor(t, p, parts[0]+"."+b64(forgedPayload)+"."+parts[2]); got != "api-key.free" {
		t.Fatalf("tampered payload got %q", got)
	}
}

func splitDots(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func TestJWTPublicKeys(t *testing.T) {
	rk, ek := testKeys(t)
	dir := t.TempDir()
	rsaDER, _ := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	ecDER, _ := x509.MarshalPKIXPublicKey(&ek.PublicKey)
	rsaPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: rsaDER})
	write := func(name string, data []byte) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	rsaFile := write("rsa.pem", rsaPEM)
	ecFile := write("ec.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecDER}))
	jwksFile := write("jwks.json", []byte(testJWKS(t)))
	claims := jwt.MapClaims{"plan": "enterprise", "exp": time.Now().Add(time.Hour).Unix()}
	otherEC, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)

	for _, src := range []string{"public_keys: [" + rsaFile + ", " + ecFile + "]", "jwks_file: " + jwksFile} {
		t.Run(src[:8], func(t *testing.T) {
			p := mustParse(t, "jwt:\n  "+src+"\n"+tieredCfg)
			for name, tc := range map[string]struct {
				token, want string
			}{
				"RS256":        {sign(t, jwt.SigningMethodRS256, rk, claims), "api-key.enterprise"},
				"PS256":        {sign(t, jwt.SigningMethodPS256, rk, claims), "api-key.enterprise"},
				"ES256":        {sign(t, jwt.SigningMethodES256, ek, claims), "api-key.enterprise"},
				"other EC key": {sign(t, jwt.SigningMethodES256, otherEC, claims), "api-key.free"},
				// Algorithm confusion: the public key's bytes used as an
				// HMAC secret must never verify.
				"HS256 with the public key": {sign(t, jwt.SigningMethodHS256, rsaPEM, claims), "api-key.free"},
				"HS256 with the DER key":    {sign(t, jwt.SigningMethodHS256, rsaDER, claims), "api-key.free"},
			} {
				if got := limitFor(t, p, tc.token); got != tc.want {
					t.Errorf("%s: limit %q, want %q", name, got, tc.want)
				}
			}
		})
	}

	privDER := x509.MarshalPKCS1PrivateKey(rk)
	privFile := write("priv.pem", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: privDER}))
	want := "c.yaml:2: jwt.public_keys[0]: " + privFile + " holds a private key; give the public key only"
	if got := problems(t, "jwt:\n  public_keys: ["+privFile+"]\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"); len(got) != 1 || got[0] != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	weak, _ := rsa.GenerateKey(rand.Reader, 1024)
	weakDER, _ := x509.MarshalPKIXPublicKey(&weak.PublicKey)
	weakFile := write("weak.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: weakDER}))
	want = "c.yaml:2: jwt.public_keys[0]: " + weakFile + ": RSA key of 1024 bits is too weak (want at least 2048)"
	if got := problems(t, "jwt:\n  public_keys: ["+weakFile+"]\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"); len(got) != 1 || got[0] != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	badJWKS := write("bad.json", []byte(`{"keys":[{"kty":"EC","crv":"P-256","x":"AQ","y":"AQ"}]}`))
	if got := problems(t, "jwt:\n  jwks_file: "+badJWKS+"\nrules:\n  - name: r\n    algorithm_config: {rps: 1, burst: 1}\n"); len(got) != 2 {
		t.Fatalf("bad JWKS: %q", got)
	}
}

func TestJWTVerifyFalse(t *testing.T) {
	p := mustParse(t, "jwt:\n  verify: false\n"+tieredCfg)
	claims := jwt.MapClaims{"plan": "enterprise", "exp": time.Now().Add(time.Hour).Unix()}
	if got := limitFor(t, p, sign(t, jwt.SigningMethodHS256, []byte("anything"), claims)); got != "api-key.enterprise" {
		t.Fatalf("unverified claims not read: %q", got)
	}
	// Even unverified, an expired token yields no claims.
	claims["exp"] = time.Now().Add(-time.Hour).Unix()
	if got := limitFor(t, p, sign(t, jwt.SigningMethodHS256, []byte("anything"), claims)); got != "api-key.free" {
		t.Fatalf("expired token's claims read: %q", got)
	}
}

func TestJWTClaimValues(t *testing.T) {
	t.Setenv("JWT_SECRET", testSecret)
	p := mustParse(t, `jwt: {hmac_secret_env: JWT_SECRET}
rules:
  - name: admins
    limit_keys: ["jwt:org.id", "jwt:n"]
    match: {"jwt:roles": admin}
    algorithm_config: {rps: 1, burst: 1}
`)
	tok := sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{
		"roles": []string{"user", "admin"}, "org": map[string]any{"id": "o:1|x"}, "n": json.Number("12345678901234567890"),
		"exp": time.Now().Add(time.Hour).Unix(),
	})
	ms, _ := p.Match(&policy.Input{Header: http.Header{"Authorization": {"bearer " + tok}}})
	if len(ms) != 1 {
		t.Fatalf("array claim did not match: %v", ms)
	}
	if got, want := ms[0].Request.Key, "o%3A1%7Cx|12345678901234567890"; got != want {
		t.Fatalf("key %q, want %q", got, want)
	}
}

// Attack: a bearer token without exp, once leaked (or minted for a trial),
// carries its plan forever. Such a token yields no claims unless the jwt
// section says require_exp: false.
func TestAttackJWTWithoutExp(t *testing.T) {
	t.Setenv("JWT_SECRET", testSecret)
	forever := jwt.MapClaims{"plan": "enterprise", "sub": "u1"}
	signed := sign(t, jwt.SigningMethodHS256, []byte(testSecret), forever)
	for _, section := range []string{"jwt:\n  hmac_secret_env: JWT_SECRET\n", "jwt:\n  verify: false\n"} {
		p := mustParse(t, section+tieredCfg)
		if got := limitFor(t, p, signed); got != "api-key.free" {
			t.Errorf("%q: a token without exp got %q, want api-key.free (no claims)", section, got)
		}
	}
	p := mustParse(t, "jwt:\n  hmac_secret_env: JWT_SECRET\n  require_exp: false\n"+tieredCfg)
	if got := limitFor(t, p, signed); got != "api-key.enterprise" {
		t.Errorf("require_exp: false: a token without exp got %q, want api-key.enterprise", got)
	}
}

// Attack: the Authorization header sent twice, "Bearer junk" then the
// client's own token, or once as "Bearer junk, Bearer TOKEN". sluice read
// no claims, so a per-user rule charged the shared (absent) bucket, or
// none under missing_key: skip, while an upstream that takes the last
// header (PHP behind nginx's FastCGI) or the last "Bearer " (Laravel)
// serves the request as the client: it escaped its own bucket. Like any
// header that servers read differently, the claims' key is (ambiguous),
// and a rule matching a claim applies.
func TestAttackRepeatedAuthorizationEscapesUserBucket(t *testing.T) {
	t.Setenv("JWT_SECRET", testSecret)
	tok := sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "u1", "plan": "free", "exp": time.Now().Add(time.Hour).Unix()})
	for _, missing := range []string{"shared", "skip"} {
		p := mustParse(t, `jwt: {hmac_secret_env: JWT_SECRET}
missing_key: `+missing+`
rules:
  - name: per-user
    match: {"jwt:plan": free}
    limit_keys: ["jwt:sub"]
    algorithm_config: {rps: 1, burst: 1}
`)
		for _, hs := range [][]string{{"Bearer junk", "Bearer " + tok}, {"Bearer " + tok, "Bearer other"}, {"Bearer junk, Bearer " + tok}, {"Bearer junkBearer " + tok}} {
			ms, err := p.Match(&policy.Input{Header: http.Header{"Authorization": hs}})
			if err != nil || len(ms) != 1 {
				t.Fatalf("missing_key %s, %q: match %v %v, want the per-user rule", missing, hs, ms, err)
			}
			if got := ms[0].Request.Key; got != policy.AmbiguousMarker {
				t.Errorf("missing_key %s, %q: keyed %q, want %q", missing, hs, got, policy.AmbiguousMarker)
			}
		}
		ms, _ := p.Match(&policy.Input{Header: http.Header{"Authorization": {"Bearer " + tok, "Bearer " + tok}}})
		if len(ms) != 1 || ms[0].Request.Key != "u1" {
			t.Errorf("missing_key %s: the same token twice: %v, want keyed u1", missing, ms)
		}
	}
}

// Attack: under verify: false the gateway in front checks one bearer
// token, and an upstream serves it; a client sends a token it made up
// (plan: enterprise, unsigned) first and its own last. A gateway or
// upstream taking the last checks and serves the client's own, while
// sluice read the made-up claims and picked the enterprise tier. Claims
// are read only from an Authorization that every server reads alike.
func TestAttackRepeatedAuthorizationPicksTier(t *testing.T) {
	exp := time.Now().Add(time.Hour).Unix()
	forged := sign(t, jwt.SigningMethodHS256, []byte("made-up-secret-of-enough-length-0123456789"), jwt.MapClaims{"plan": "enterprise", "sub": "u1", "exp": exp})
	own := sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"plan": "free", "sub": "u1", "exp": exp})
	p := mustParse(t, "jwt:\n  verify: false\n"+tieredCfg)
	for _, auth := range [][]string{{"Bearer " + forged, "Bearer " + own}, {"Bearer " + forged + ", Bearer " + own}} {
		h := http.Header{"X-Api-Key": {"k-1"}, "Authorization": auth}
		ms, err := p.Match(&policy.Input{Method: "GET", Path: "/", Header: h})
		if err != nil || len(ms) != 1 {
			t.Fatalf("matches %v, err %v", ms, err)
		}
		if got := ms[0].Request.Limit.Name(); got != "api-key.free" {
			t.Errorf("%d Authorization values: limited by %s, want api-key.free (no claims)", len(auth), got)
		}
	}
}

// Attack: "Authorization: Bearer<TAB>TOKEN". RFC 9110 puts a space after
// the scheme, and sluice read no bearer token without one, so a per-user
// rule charged the shared (absent) bucket; but league/oauth2-server
// (Laravel Passport) takes any white space there and serves the client
// as itself. The token is read as the most lenient upstream reads it.
func TestAttackTabAfterBearerHidesClaims(t *testing.T) {
	t.Setenv("JWT_SECRET", testSecret)
	tok := sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "u1", "exp": time.Now().Add(time.Hour).Unix()})
	p := mustParse(t, `jwt: {hmac_secret_env: JWT_SECRET}
rules:
  - name: per-user
    limit_keys: ["jwt:sub"]
    algorithm_config: {rps: 1, burst: 1}
`)
	for _, a := range []string{"Bearer\t" + tok, "bearer \t " + tok} {
		ms, err := p.Match(&policy.Input{Header: http.Header{"Authorization": {a}}})
		if err != nil || len(ms) != 1 || ms[0].Request.Key != "u1" {
			t.Errorf("%q: %v %v, want keyed u1", a[:9], ms, err)
		}
	}
}

// Attack: the client's token in the query, ?access_token=TOKEN (RFC 6750
// section 2.3), without an Authorization header. passport-http-bearer
// reads it by default and serves the client as itself, while sluice read
// no claims: a per-user rule charged the shared (absent) bucket, or none
// under missing_key: skip. Its claims' key is (ambiguous), and a rule
// matching a claim applies.
func TestAttackAccessTokenQueryHidesClaims(t *testing.T) {
	t.Setenv("JWT_SECRET", testSecret)
	tok := sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "u1", "plan": "free", "exp": time.Now().Add(time.Hour).Unix()})
	p := mustParse(t, `jwt: {hmac_secret_env: JWT_SECRET}
missing_key: skip
rules:
  - name: per-user
    match: {"jwt:plan": free}
    limit_keys: ["jwt:sub"]
    algorithm_config: {rps: 1, burst: 1}
`)
	ms, err := p.Match(&policy.Input{RawQuery: "access_token=" + tok})
	if err != nil || len(ms) != 1 || ms[0].Request.Key != policy.AmbiguousMarker {
		t.Fatalf("?access_token=: %v %v, want the per-user rule keyed %q", ms, err, policy.AmbiguousMarker)
	}
	// Beside a bearer header it is not read (or the request is refused).
	ms, err = p.Match(&policy.Input{RawQuery: "access_token=x", Header: http.Header{"Authorization": {"Bearer " + tok}}})
	if err != nil || len(ms) != 1 || ms[0].Request.Key != "u1" {
		t.Fatalf("?access_token= beside Authorization: %v %v, want keyed u1", ms, err)
	}
}
