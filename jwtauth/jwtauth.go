// Package jwtauth verifies the JSON Web Tokens that a sluice policy reads
// claims from (jwt:CLAIM key sources): the keys (HMAC secrets, RSA and
// ECDSA public keys from PEM or JWKS files) and the checks of a token's
// claims. Package policy reads the jwt section of a configuration file
// into a Verifier, and asks it only for a request's verified claims.
package jwtauth

import (
	"cmp"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Verifier checks bearer tokens and yields their claims (the jwt
// section of a configuration file). Claims come only
// from a token whose signature verifies against a configured key with an
// algorithm of that key's type, that has an exp (unless require_exp:
// false), and whose exp and nbf hold (with leeway); otherwise the request
// has no claims at all. With verify: false the signature is not checked
// (a gateway in front has done it), but the time claims, issuer and
// audience still are.
type Verifier struct {
	verify  bool
	hmac    [][]byte
	rsa     []pubKey
	ec      []pubKey
	methods []string
	parser  *jwt.Parser
	check   *jwt.Validator // for verify: false
}

type pubKey struct {
	kid string
	key any // *rsa.PublicKey or *ecdsa.PublicKey
}

// maxToken bounds the bearer tokens looked at.
const maxToken = 16 << 10

// MinHMACKey is the shortest HMAC secret accepted: RFC 7518 section 3.2
// requires a key at least as long as the hash output (256 bits for HS256).
const MinHMACKey = 32

// minRSABits is the smallest RSA key accepted.
const minRSABits = 2048

// Claims returns the verified claims of the request's bearer token, or
// nil: also when servers may read another token (AmbiguousBearer), which
// the gateway in front may have verified instead.
func (v *Verifier) Claims(h http.Header) map[string]any {
	tok := BearerToken(h)
	if tok == "" || AmbiguousBearer(h) {
		return nil
	}
	claims := jwt.MapClaims{}
	if !v.verify {
		if _, _, err := v.parser.ParseUnverified(tok, claims); err != nil {
			return nil
		}
		if err := v.check.Validate(claims); err != nil {
			return nil
		}
		return claims
	}
	t, err := v.parser.ParseWithClaims(tok, claims, v.keyFor)
	if err != nil || !t.Valid {
		return nil
	}
	return claims
}

// BearerToken returns the token of an "Authorization: Bearer" header (the
// scheme in any case, RFC 9110 section 11.1, and a space or a tab after
// it, as league/oauth2-server reads it), or "" when there is none or it
// is longer than any token sluice reads. Every reader of bearer tokens
// uses it, so they agree on what a bearer token is.
func BearerToken(h http.Header) string {
	a := h.Get("Authorization")
	if len(a) > maxToken+7 || len(a) < 7 || !strings.EqualFold(a[:6], "bearer") || (a[6] != ' ' && a[6] != '\t') {
		return ""
	}
	return strings.TrimSpace(a[7:])
}

// AmbiguousBearer reports whether upstreams may read another bearer token
// from h than BearerToken: Authorization given twice (PHP takes the last),
// or holding more than a scheme and a credential (Laravel takes what
// follows the last "Bearer "; others split at commas).
func AmbiguousBearer(h http.Header) bool {
	vs := h["Authorization"]
	return slices.ContainsFunc(vs, func(v string) bool {
		fields := 0
		for range strings.FieldsSeq(v) {
			fields++
		}
		return v != vs[0] || strings.Contains(v, ",") || fields > 2
	})
}

// keyFor offers the keys of the token's algorithm family only, so a
// public key can never be used as an HMAC secret.
func (v *Verifier) keyFor(t *jwt.Token) (any, error) {
	kid, _ := t.Header["kid"].(string)
	var set jwt.VerificationKeySet
	switch t.Method.(type) {
	case *jwt.SigningMethodHMAC:
		for _, k := range v.hmac {
			set.Keys = append(set.Keys, k)
		}
	case *jwt.SigningMethodRSA, *jwt.SigningMethodRSAPSS:
		set.Keys = pick(v.rsa, kid, nil)
	case *jwt.SigningMethodECDSA:
		set.Keys = pick(v.ec, kid, esCurves[t.Method.Alg()])
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("no key for %s", t.Method.Alg())
	}
	return set, nil
}

// esCurves are the ECDSA signing algorithms' curves.
var esCurves = map[string]elliptic.Curve{"ES256": elliptic.P256(), "ES384": elliptic.P384(), "ES512": elliptic.P521()}

// pick returns the keys with the token's kid when some key has it, else
// every key (of the curve, for ECDSA).
func pick(keys []pubKey, kid string, curve elliptic.Curve) []jwt.VerificationKey {
	var byKid, all []jwt.VerificationKey
	for _, k := range keys {
		if curve != nil {
			if ek, ok := k.key.(*ecdsa.PublicKey); !ok || ek.Curve != curve {
				continue
			}
		}
		all = append(all, k.key)
		if kid != "" && k.kid == kid {
			byKid = append(byKid, k.key)
		}
	}
	if len(byKid) > 0 {
		return byKid
	}
	return all
}

// Checks are the checks of a token's claims, made with or without
// verification: the jwt section's require_exp, leeway, issuer and
// audience.
type Checks struct {
	// RequireExp refuses a token without exp: such a token would be good
	// forever.
	RequireExp bool
	// Leeway is the clock skew allowed on exp and nbf.
	Leeway time.Duration
	// Issuer, when set, is the iss a token must have.
	Issuer string
	// Audience, when set, lists the aud values a token must have one of.
	Audience []string
}

// options are c as the jwt parser's options.
func (c Checks) options() []jwt.ParserOption {
	var opts []jwt.ParserOption
	if c.RequireExp {
		opts = append(opts, jwt.WithExpirationRequired())
	}
	if c.Leeway != 0 {
		opts = append(opts, jwt.WithLeeway(c.Leeway))
	}
	if c.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(c.Issuer))
	}
	if len(c.Audience) > 0 {
		opts = append(opts, jwt.WithAudience(c.Audience...))
	}
	return append(opts, jwt.WithJSONNumber())
}

// Unverified is a Verifier that does not check signatures (verify: false,
// where a gateway in front has checked them) but still makes checks c.
func Unverified(c Checks) *Verifier {
	opts := c.options()
	return &Verifier{parser: jwt.NewParser(opts...), check: jwt.NewValidator(opts...)}
}

// Keys are the verification keys of a Verifier, gathered one source after
// another. Each Add method reports what is wrong with what it was given;
// the keys it could read are kept.
type Keys struct {
	hmac [][]byte
	rsa  []pubKey
	ec   []pubKey
}

// AddHMAC adds an HMAC secret, which the caller has checked is at least
// MinHMACKey bytes.
func (k *Keys) AddHMAC(secret []byte) { k.hmac = append(k.hmac, secret) }

// Verified is a Verifier that checks signatures against keys, with an
// algorithm of the key's type only, and makes checks c.
func Verified(c Checks, keys *Keys) *Verifier {
	v := &Verifier{verify: true, hmac: keys.hmac, rsa: keys.rsa, ec: keys.ec}
	v.setMethods()
	v.parser = jwt.NewParser(append(c.options(), jwt.WithValidMethods(v.methods))...)
	return v
}

// setMethods lists the signing algorithms of the keys loaded: a token
// signed with any other is refused before a key is looked at.
func (v *Verifier) setMethods() {
	if len(v.hmac) > 0 {
		v.methods = append(v.methods, "HS256", "HS384", "HS512")
	}
	if len(v.rsa) > 0 {
		v.methods = append(v.methods, "RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
	}
	for alg, curve := range esCurves {
		for _, k := range v.ec {
			if k.key.(*ecdsa.PublicKey).Curve == curve {
				v.methods = append(v.methods, alg)
				break
			}
		}
	}
}

// AddPEM adds the public keys of a PEM file, named file in messages:
// PUBLIC KEY (PKIX), RSA PUBLIC KEY (PKCS #1) or CERTIFICATE blocks. It
// returns what is wrong with the file, "" when nothing is; it stops at
// the first problem.
func (k *Keys) AddPEM(file string, data []byte) string {
	found := 0
	for b, rest := pem.Decode(data); b != nil; b, rest = pem.Decode(rest) {
		var key any
		var err error
		switch b.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(b.Bytes)
		case "RSA PUBLIC KEY":
			key, err = x509.ParsePKCS1PublicKey(b.Bytes)
		case "CERTIFICATE":
			var c *x509.Certificate
			if c, err = x509.ParseCertificate(b.Bytes); err == nil {
				key = c.PublicKey
			}
		default:
			if strings.Contains(b.Type, "PRIVATE") {
				return fmt.Sprintf("%s holds a private key; give the public key only", file)
			}
			return fmt.Sprintf("%s: unsupported PEM block %q (want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)", file, b.Type)
		}
		if err != nil {
			return fmt.Sprintf("%s: %v", file, err)
		}
		if msg := k.add("", key); msg != "" {
			return fmt.Sprintf("%s: %s", file, msg)
		}
		found++
	}
	if found == 0 {
		return fmt.Sprintf("%s holds no PEM public key", file)
	}
	return ""
}

// AddJWKS adds the RSA and EC keys of a JSON Web Key Set file, named file
// in messages; keys marked for encryption are skipped. It returns what is
// wrong, one message per problem: a key that cannot be used is reported
// and the others are still added.
func (k *Keys) AddJWKS(file string, data []byte) []string {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return []string{fmt.Sprintf("%s is not a JSON Web Key Set: %v", file, err)}
	}
	var msgs []string
	added := 0
	for i, j := range set.Keys {
		if j.Use == "enc" {
			continue
		}
		key, err := j.publicKey()
		if err == nil {
			if msg := k.add(j.Kid, key); msg != "" {
				err = fmt.Errorf("%s", msg)
			}
		}
		if err != nil {
			msgs = append(msgs, fmt.Sprintf("%s: keys[%d] (kid %q): %v", file, i, j.Kid, err))
			continue
		}
		added++
	}
	if added == 0 {
		msgs = append(msgs, fmt.Sprintf("%s holds no usable signature key", file))
	}
	return msgs
}

// add records a public key, checking its type and strength.
func (k *Keys) add(kid string, key any) string {
	switch pk := key.(type) {
	case *rsa.PublicKey:
		if pk.N.BitLen() < minRSABits {
			return fmt.Sprintf("RSA key of %d bits is too weak (want at least %d)", pk.N.BitLen(), minRSABits)
		}
		k.rsa = append(k.rsa, pubKey{kid, pk})
	case *ecdsa.PublicKey:
		switch pk.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
		default:
			return "unsupported ECDSA curve (want P-256, P-384 or P-521)"
		}
		k.ec = append(k.ec, pubKey{kid, pk})
	default:
		return fmt.Sprintf("unsupported key type %T (want RSA or ECDSA)", key)
	}
	return ""
}

// jwk is one key of a JSON Web Key Set (RFC 7517).
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

func (k jwk) publicKey() (any, error) {
	b64 := func(field, s string) ([]byte, error) {
		b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
		if err != nil || len(b) == 0 {
			return nil, fmt.Errorf("%s is not base64url", field)
		}
		return b, nil
	}
	switch k.Kty {
	case "RSA":
		n, errN := b64("n", k.N)
		e, errE := b64("e", k.E)
		if err := cmp.Or(errN, errE); err != nil {
			return nil, err
		}
		if len(e) > 4 {
			return nil, fmt.Errorf("exponent too large")
		}
		exp := int(new(big.Int).SetBytes(e).Int64())
		if exp < 3 || exp%2 == 0 {
			return nil, fmt.Errorf("invalid exponent %d", exp)
		}
		return &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: exp}, nil
	case "EC":
		var curve elliptic.Curve
		var dh ecdh.Curve
		switch k.Crv {
		case "P-256":
			curve, dh = elliptic.P256(), ecdh.P256()
		case "P-384":
			curve, dh = elliptic.P384(), ecdh.P384()
		case "P-521":
			curve, dh = elliptic.P521(), ecdh.P521()
		default:
			return nil, fmt.Errorf("unsupported curve %q", k.Crv)
		}
		x, errX := b64("x", k.X)
		y, errY := b64("y", k.Y)
		if err := cmp.Or(errX, errY); err != nil {
			return nil, err
		}
		size := (curve.Params().BitSize + 7) / 8
		if len(x) != size || len(y) != size {
			return nil, fmt.Errorf("x and y must be %d bytes for %s", size, k.Crv)
		}
		// crypto/ecdh checks that the point is on the curve.
		point := append(append([]byte{4}, x...), y...)
		if _, err := dh.NewPublicKey(point); err != nil {
			return nil, fmt.Errorf("the point is not on %s", k.Crv)
		}
		return &ecdsa.PublicKey{Curve: curve, X: new(big.Int).SetBytes(x), Y: new(big.Int).SetBytes(y)}, nil
	}
	return nil, fmt.Errorf("unsupported kty %q (want RSA or EC)", k.Kty)
}
