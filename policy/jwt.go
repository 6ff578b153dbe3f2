package policy

import (
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/jwtauth"
)

// claimsVerifier is what keys need of JWT verification: the claims of a
// request's bearer token, nil unless it verifies (package jwtauth's
// Verifier, read from the jwt section).
type claimsVerifier interface {
	Claims(h http.Header) map[string]any
}

var jwtFields = []string{"verify", "hmac_secret_env", "public_keys", "jwks_file", "issuer", "audience", "leeway", "require_exp"}

// jwt validates the jwt section and loads its keys; nil when the section
// is refused.
func (l *loader) jwt(n *yaml.Node, path string) claimsVerifier {
	o := l.object(n, path, jwtFields)
	if o == nil {
		return nil
	}
	verify := true
	if b, _, ok := o.boolean("verify"); ok {
		verify = b
	}
	checks := l.jwtClaimChecks(o)
	hasKeys := o.has("hmac_secret_env") || o.has("public_keys") || o.has("jwks_file")
	if !verify {
		if hasKeys {
			l.errf(o.vals["verify"], join(path, "verify"), "is false, so the keys given are never used; remove them, or verify")
		}
		return jwtauth.Unverified(checks)
	}
	if !hasKeys {
		l.errf(o.n, path, "needs a verification key: hmac_secret_env, public_keys or jwks_file (or verify: false when a gateway in front verifies tokens)")
		return nil
	}
	var keys jwtauth.Keys
	l.jwtKeys(o, &keys)
	return jwtauth.Verified(checks, &keys)
}

// jwtClaimChecks reads require_exp, leeway, issuer and audience: the
// checks of a token's claims, made with or without verify.
func (l *loader) jwtClaimChecks(o *obj) jwtauth.Checks {
	path := o.path
	// A token without exp would be good forever: one leaked token, or one
	// minted for a trial, would carry its plan for good. Such a token has
	// no claims unless require_exp: false says the issuer never sets exp.
	c := jwtauth.Checks{RequireExp: true}
	if req, _, ok := o.boolean("require_exp"); ok {
		c.RequireExp = req
	}
	if d, dn, ok := o.duration("leeway"); ok {
		if d < 0 || d > time.Hour {
			l.errf(dn, join(path, "leeway"), "must be between 0s and 1h (got %q)", dn.Value)
		} else {
			c.Leeway = d
		}
	}
	if iss, _, ok := o.str("issuer"); ok {
		c.Issuer = iss
	}
	if an, ok := o.vals["audience"]; ok {
		if auds, ok := l.matchValues(an, join(path, "audience")); ok {
			c.Audience = auds
		}
	}
	return c
}

// jwtKeys loads the verification keys: hmac_secret_env, public_keys and
// jwks_file.
func (l *loader) jwtKeys(o *obj, keys *jwtauth.Keys) {
	path := o.path
	if name, nn, ok := o.str("hmac_secret_env"); ok {
		p := join(path, "hmac_secret_env")
		switch secret := l.getenv(name); {
		case !envName.MatchString(name):
			l.errf(nn, p, "must be the name of an environment variable (got %q)", name)
		case secret == "":
			l.errf(nn, p, "environment variable %s is not set or empty", name)
		case len(secret) < jwtauth.MinHMACKey:
			l.errf(nn, p, "the secret in %s is %d bytes; HMAC keys need at least %d (RFC 7518 section 3.2)", name, len(secret), jwtauth.MinHMACKey)
		default:
			keys.AddHMAC([]byte(secret))
		}
	}
	if files, nodes, ok := o.strList("public_keys"); ok {
		for i, f := range files {
			p := fmt.Sprintf("%s.public_keys[%d]", path, i)
			if data, ok := l.keyFile(f, nodes[i], p); ok {
				if msg := keys.AddPEM(f, data); msg != "" {
					l.errf(nodes[i], p, "%s", msg)
				}
			}
		}
	}
	if f, fn, ok := o.str("jwks_file"); ok {
		p := join(path, "jwks_file")
		if data, ok := l.keyFile(f, fn, p); ok {
			for _, msg := range keys.AddJWKS(f, data) {
				l.errf(fn, p, "%s", msg)
			}
		}
	}
}

// keyFile reads a key file named in the file at n, relative to the
// file's directory; a file it cannot read is reported.
func (l *loader) keyFile(file string, n *yaml.Node, path string) ([]byte, bool) {
	data, err := l.readFile(l.resolve(file))
	if err != nil {
		l.errf(n, path, "%v", err)
		return nil, false
	}
	return data, true
}

func (l *loader) resolve(file string) string {
	if filepath.IsAbs(file) {
		return file
	}
	return filepath.Join(l.dir, file)
}
