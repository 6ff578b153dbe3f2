package policy

import (
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
	"path/filepath"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"gopkg.in/yaml.v3"
)

// verifier checks bearer tokens and yields their claims. Claims come only
// from a token whose signature verifies against a configured key with an
// algorithm of that key's type, that has an exp (unless require_exp:
// false), and whose exp and nbf hold (with leeway); otherwise the request
// has no claims at all. With verify: false the signature is not checked
// (a gateway in front has done it), but the time claims, issuer and
// audience still are.
type verifier struct {
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

// minHMACKey is the shortest HMAC secret accepted: RFC 7518 section 3.2
// requires a key at least as long as the hash output (256 bits for HS256).
const minHMACKey = 32

// minRSABits is the smallest RSA key accepted.
const minRSABits = 2048

// claims returns the verified claims of the request's bearer token, or nil.
func (v *verifier) claims(h http.Header) map[string]any {
	tok := bearer(h)
	if tok == "" {
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

// bearer returns the token of an "Authorization: Bearer" header.
func bearer(h http.Header) string {
	a := h.Get("Authorization")
	if len(a) > maxToken+7 || len(a) < 7 || !strings.EqualFold(a[:7], "bearer ") {
		return ""
	}
	return strings.TrimSpace(a[7:])
}

// keyFor offers the keys of the token's algorithm family only, so a
// public key can never be used as an HMAC secret.
func (v *verifier) keyFor(t *jwt.Token) (any, error) {
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
		curve := map[string]elliptic.Curve{"ES256": elliptic.P256(), "ES384": elliptic.P384(), "ES512": elliptic.P521()}[t.Method.Alg()]
		set.Keys = pick(v.ec, kid, curve)
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("no key for %s", t.Method.Alg())
	}
	return set, nil
}

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

var jwtFields = []string{"verify", "hmac_secret_env", "public_keys", "jwks_file", "issuer", "audience", "leeway", "require_exp"}

// jwt validates the jwt section and loads its keys.
func (l *loader) jwt(n *yaml.Node, path string) *verifier {
	o := l.object(n, path, jwtFields)
	if o == nil {
		return nil
	}
	v := &verifier{verify: true}
	if b, _, ok := o.boolean("verify"); ok {
		v.verify = b
	}
	opts := l.jwtClaimChecks(o)
	hasKeys := o.has("hmac_secret_env") || o.has("public_keys") || o.has("jwks_file")
	if !v.verify {
		if hasKeys {
			l.errf(o.vals["verify"], join(path, "verify"), "is false, so the keys given are never used; remove them, or verify")
		}
		opts = append(opts, jwt.WithJSONNumber())
		v.parser = jwt.NewParser(opts...)
		v.check = jwt.NewValidator(opts...)
		return v
	}
	if !hasKeys {
		l.errf(o.n, path, "needs a verification key: hmac_secret_env, public_keys or jwks_file (or verify: false when a gateway in front verifies tokens)")
		return nil
	}
	l.jwtKeys(o, v)
	v.setMethods()
	opts = append(opts, jwt.WithValidMethods(v.methods), jwt.WithJSONNumber())
	v.parser = jwt.NewParser(opts...)
	return v
}

// jwtClaimChecks reads require_exp, leeway, issuer and audience: the
// checks of a token's claims, made with or without verify.
func (l *loader) jwtClaimChecks(o *obj) []jwt.ParserOption {
	path := o.path
	var opts []jwt.ParserOption
	// A token without exp would be good forever: one leaked token, or one
	// minted for a trial, would carry its plan for good. Such a token has
	// no claims unless require_exp: false says the issuer never sets exp.
	if req, _, ok := o.boolean("require_exp"); !ok || req {
		opts = append(opts, jwt.WithExpirationRequired())
	}
	if d, dn, ok := o.duration("leeway"); ok {
		if d < 0 || d > time.Hour {
			l.errf(dn, join(path, "leeway"), "must be between 0s and 1h (got %q)", dn.Value)
		} else {
			opts = append(opts, jwt.WithLeeway(d))
		}
	}
	if iss, _, ok := o.str("issuer"); ok {
		opts = append(opts, jwt.WithIssuer(iss))
	}
	if an, ok := o.vals["audience"]; ok {
		if auds, ok := l.matchValues(an, join(path, "audience")); ok {
			opts = append(opts, jwt.WithAudience(auds...))
		}
	}
	return opts
}

// jwtKeys loads the verification keys: hmac_secret_env, public_keys and
// jwks_file.
func (l *loader) jwtKeys(o *obj, v *verifier) {
	path := o.path
	if name, nn, ok := o.str("hmac_secret_env"); ok {
		p := join(path, "hmac_secret_env")
		switch secret := l.getenv(name); {
		case !envName.MatchString(name):
			l.errf(nn, p, "must be the name of an environment variable (got %q)", name)
		case secret == "":
			l.errf(nn, p, "environment variable %s is not set or empty", name)
		case len(secret) < minHMACKey:
			l.errf(nn, p, "the secret in %s is %d bytes; HMAC keys need at least %d (RFC 7518 section 3.2)", name, len(secret), minHMACKey)
		default:
			v.hmac = append(v.hmac, []byte(secret))
		}
	}
	if files, nodes, ok := o.strList("public_keys"); ok {
		for i, f := range files {
			l.pemKeys(v, f, nodes[i], fmt.Sprintf("%s.public_keys[%d]", path, i))
		}
	}
	if f, fn, ok := o.str("jwks_file"); ok {
		l.jwks(v, f, fn, join(path, "jwks_file"))
	}
}

// setMethods lists the signing algorithms of the keys loaded: a token
// signed with any other is refused before a key is looked at.
func (v *verifier) setMethods() {
	if len(v.hmac) > 0 {
		v.methods = append(v.methods, "HS256", "HS384", "HS512")
	}
	if len(v.rsa) > 0 {
		v.methods = append(v.methods, "RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
	}
	for alg, curve := range map[string]elliptic.Curve{"ES256": elliptic.P256(), "ES384": elliptic.P384(), "ES512": elliptic.P521()} {
		for _, k := range v.ec {
			if k.key.(*ecdsa.PublicKey).Curve == curve {
				v.methods = append(v.methods, alg)
				break
			}
		}
	}
}

func (l *loader) resolve(file string) string {
	if filepath.IsAbs(file) {
		return file
	}
	return filepath.Join(l.dir, file)
}

// pemKeys loads the public keys of a PEM file: PUBLIC KEY (PKIX), RSA
// PUBLIC KEY (PKCS #1) or CERTIFICATE blocks.
func (l *loader) pemKeys(v *verifier, file string, n *yaml.Node, path string) {
	data, err := l.readFile(l.resolve(file))
	if err != nil {
		l.errf(n, path, "%v", err)
		return
	}
	found := 0
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		var key any
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
				l.errf(n, path, "%s holds a private key; give the public key only", file)
			} else {
				l.errf(n, path, "%s: unsupported PEM block %q (want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)", file, b.Type)
			}
			return
		}
		if err != nil {
			l.errf(n, path, "%s: %v", file, err)
			return
		}
		if msg := v.add("", key); msg != "" {
			l.errf(n, path, "%s: %s", file, msg)
			return
		}
		found++
	}
	if found == 0 {
		l.errf(n, path, "%s holds no PEM public key", file)
	}
}

// add records a public key, checking its type and strength.
func (v *verifier) add(kid string, key any) string {
	switch k := key.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < minRSABits {
			return fmt.Sprintf("RSA key of %d bits is too weak (want at least %d)", k.N.BitLen(), minRSABits)
		}
		v.rsa = append(v.rsa, pubKey{kid, k})
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
		default:
			return "unsupported ECDSA curve (want P-256, P-384 or P-521)"
		}
		v.ec = append(v.ec, pubKey{kid, k})
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

// jwks loads the RSA and EC keys of a JWKS file; keys marked for
// encryption are skipped.
func (l *loader) jwks(v *verifier, file string, n *yaml.Node, path string) {
	data, err := l.readFile(l.resolve(file))
	if err != nil {
		l.errf(n, path, "%v", err)
		return
	}
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		l.errf(n, path, "%s is not a JSON Web Key Set: %v", file, err)
		return
	}
	added := 0
	for i, k := range set.Keys {
		if k.Use == "enc" {
			continue
		}
		key, err := k.publicKey()
		if err == nil {
			if msg := v.add(k.Kid, key); msg != "" {
				err = fmt.Errorf("%s", msg)
			}
		}
		if err != nil {
			l.errf(n, path, "%s: keys[%d] (kid %q): %v", file, i, k.Kid, err)
			continue
		}
		added++
	}
	if added == 0 {
		l.errf(n, path, "%s holds no usable signature key", file)
	}
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
		n, err := b64("n", k.N)
		if err != nil {
			return nil, err
		}
		e, err := b64("e", k.E)
		if err != nil {
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
		x, err := b64("x", k.X)
		if err != nil {
			return nil, err
		}
		y, err := b64("y", k.Y)
		if err != nil {
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
