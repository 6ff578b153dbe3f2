package httpgate

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/jwtauth"
)

// The live page: GET /ui (HTML), its script and style (GET /ui/app.js,
// /ui/app.css), the login form's target (POST /ui/login) and its data
// (GET /v1/stats, stats.go). Everything it loads is in the binary; it
// loads nothing from elsewhere and works offline.
//
// It shows keys, which are client addresses and user ids, so it is
// behind the admin token (admin_token_env), and disabled without one:
//
//   - Authorization: Bearer TOKEN on any of them (curl, scripts);
//   - or, in a browser, the token once, as /ui?token=TOKEN or through the
//     login form: the answer sets a session cookie and redirects to a
//     clean /ui, so the token stays out of the address bar, the history
//     and Referer headers. The cookie is HttpOnly and SameSite=Strict, is
//     not the token but an HMAC, under a secret drawn when the process
//     starts, of its expiry and the token's digest: it expires after
//     uiSession, on restart, and when the token changes. It opens the
//     page and /v1/stats only, never /v1/reset (which reads the bearer
//     token alone), so a request forged from another site can do nothing
//     with it but what the page's own POSTs do: the reset button
//     (POST /ui/reset) needs, besides the cookie, a CSRF token bound to
//     it, which the page reads from /v1/stats (csrfToken); another site
//     can neither read it nor send the cookie (SameSite=Strict), and a
//     POST whose Origin is another site's is refused.
//
// Every value the page shows is set as text by the script (never as
// HTML), under a Content-Security-Policy that allows only the page's own
// script: a key such as <img src=x onerror=...> is shown as those
// characters.

//go:embed ui
var uiFiles embed.FS

// uiCookie names the live page's session cookie.
const uiCookie = "sluice_ui"

// uiSession is how long a login lasts.
const uiSession = 12 * time.Hour

// uiSecrets are drawn when the gate starts: one signs session cookies,
// the other keys the hashes of keys under ui.show_keys: false. Neither
// leaves the process.
type uiSecrets struct {
	cookie, keys [32]byte
}

func newUISecrets() *uiSecrets {
	s := &uiSecrets{}
	rand.Read(s.cookie[:]) // crypto/rand.Read never fails (Go 1.24+)
	rand.Read(s.keys[:])
	return s
}

// uiHeaders are set on every answer of the live page: it may not be
// framed, cached, sniffed or run any script but its own, and it sends no
// Referer.
func uiHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

func (g *Gate) uiRoutes() []route {
	static := func(name, ctype string) http.Handler {
		data, _ := uiFiles.ReadFile("ui/" + name) // embedded: always there
		return g.uiEnabled(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			uiHeaders(w.Header())
			w.Header().Set("Content-Type", ctype)
			w.Write(data)
		}))
	}
	return []route{
		{"GET", "/ui", "the live page: rules, hottest keys, store health; needs the admin token", g.uiEnabled(http.HandlerFunc(g.uiPage))},
		{"POST", "/ui/login", "the live page's login form: token=<admin token>", g.uiEnabled(http.HandlerFunc(g.uiLogin))},
		{"POST", "/ui/reset", "the live page's reset button: rule=<rule>&key=<key>, with the page's CSRF token (csrf= or X-CSRF-Token); needs the admin token", g.uiEnabled(http.HandlerFunc(g.uiReset))},
		{"GET", "/ui/app.js", "the live page's script", static("app.js", "text/javascript; charset=utf-8")},
		{"GET", "/ui/app.css", "the live page's style", static("app.css", "text/css; charset=utf-8")},
		{"GET", "/v1/stats", "what the live page shows, as JSON; needs the admin token", g.uiEnabled(http.HandlerFunc(g.stats))},
		{"GET", "/v1/stats/key", "one key's buckets under every rule, read from the store: ?key=<key>; needs the admin token", g.uiEnabled(http.HandlerFunc(g.statsKey))},
	}
}

// adminToken is the admin token in force, "" when none is configured.
func (g *Gate) adminToken() string {
	if env := g.Policy().Settings.AdminTokenEnv; env != "" {
		return g.opts.Getenv(env)
	}
	return ""
}

// uiEnabled answers 403 while no admin token is configured: the page
// shows whose traffic is limited, and is never open.
func (g *Gate) uiEnabled(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.adminToken() == "" {
			uiHeaders(w.Header())
			badRequest(w, http.StatusForbidden, "the live page is disabled: no admin token is configured (admin_token_env)")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// sessionMAC signs a session cookie expiring at exp for token.
func (g *Gate) sessionMAC(exp int64, token string) []byte {
	digest := sha256.Sum256([]byte(token))
	m := hmac.New(sha256.New, g.ui.cookie[:])
	m.Write([]byte("sluice-ui-session\x00" + strconv.FormatInt(exp, 10) + "\x00"))
	m.Write(digest[:])
	return m.Sum(nil)
}

// session returns a cookie value for token: its expiry and its MAC.
func (g *Gate) session(token string, now time.Time) string {
	exp := now.Add(uiSession).Unix()
	return strconv.FormatInt(exp, 10) + "." + base64.RawURLEncoding.EncodeToString(g.sessionMAC(exp, token))
}

// validSession reports whether a cookie value is a session this process
// issued for token that has not expired.
func (g *Gate) validSession(value, token string, now time.Time) bool {
	e, mac, ok := strings.Cut(value, ".")
	if !ok || len(e) > 20 || len(mac) > 64 {
		return false
	}
	exp, err := strconv.ParseInt(e, 10, 64)
	if err != nil || now.Unix() >= exp || exp > now.Add(uiSession).Unix() {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	return err == nil && hmac.Equal(got, g.sessionMAC(exp, token))
}

// uiAuthorized reports whether r holds the admin token, as a bearer token
// or as a session cookie. wait > 0: r's client is out of token guesses
// (checkToken) and holds no valid session.
func (g *Gate) uiAuthorized(r *http.Request) (ok bool, wait time.Duration) {
	token := g.adminToken()
	c, err := r.Cookie(uiCookie)
	if err == nil && g.validSession(c.Value, token, time.Now()) {
		return true, 0
	}
	return g.checkToken(r, jwtauth.BearerToken(r.Header), token)
}

// sessionCookie is a new session for token. Path / because the page's
// data is at /v1/stats; Secure when the page is served over TLS.
func (g *Gate) sessionCookie(r *http.Request, token string) *http.Cookie {
	return &http.Cookie{
		Name:     uiCookie,
		Value:    g.session(token, time.Now()),
		Path:     "/",
		MaxAge:   int(uiSession / time.Second),
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	}
}

// startSession sets the session cookie and sends the browser to the
// clean page (relative, so that the page works under a path prefix).
func (g *Gate) startSession(w http.ResponseWriter, r *http.Request, token, to string) {
	http.SetCookie(w, g.sessionCookie(r, token))
	uiHeaders(w.Header())
	w.Header().Set("Location", to)
	w.WriteHeader(http.StatusSeeOther)
}

func (g *Gate) uiPage(w http.ResponseWriter, r *http.Request) {
	ok, wait, why := false, time.Duration(0), ""
	if _, given := r.URL.Query()["token"]; given {
		// The token once, in the address: trade it for a cookie and
		// leave the address at once.
		if ok, wait = g.checkToken(r, r.URL.Query().Get("token"), g.adminToken()); ok {
			g.startSession(w, r, g.adminToken(), "ui")
			return
		}
		why = "That is not the admin token."
	} else {
		ok, wait = g.uiAuthorized(r)
	}
	switch {
	case !ok && wait > 0:
		uiHeaders(w.Header())
		tooManyGuesses(w, wait)
		return
	case !ok:
		g.loginForm(w, r, http.StatusUnauthorized, why)
		return
	}
	if jwtauth.BearerToken(r.Header) != "" {
		// A browser given the bearer token (by an extension or a proxy)
		// needs the cookie for the page's own requests.
		http.SetCookie(w, g.sessionCookie(r, g.adminToken()))
	}
	page, _ := uiFiles.ReadFile("ui/index.html")
	uiHeaders(w.Header())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(page)
}

// maxLoginBody bounds the login form: a token and little else.
const maxLoginBody = 4 << 10

// sameOrigin reports whether r, a POST, comes from this server's own
// pages: browsers send Origin with every POST.
func sameOrigin(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	return true
}

func (g *Gate) uiLogin(w http.ResponseWriter, r *http.Request) {
	// A login posted from another site's page (login CSRF) is refused.
	if !sameOrigin(r) {
		uiHeaders(w.Header())
		badRequest(w, http.StatusForbidden, "the login form is accepted only from the live page itself")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if err := r.ParseForm(); err != nil {
		g.loginForm(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	if ok, wait := g.checkToken(r, r.PostForm.Get("token"), g.adminToken()); !ok {
		if wait > 0 {
			uiHeaders(w.Header())
			tooManyGuesses(w, wait)
			return
		}
		g.loginForm(w, r, http.StatusUnauthorized, "That is not the admin token.")
		return
	}
	g.startSession(w, r, g.adminToken(), "../ui")
}

var loginTemplate = template.Must(template.ParseFS(uiFiles, "ui/login.html"))

// loginForm answers r with the login form, saying msg when not empty.
// Its links are relative to where it is served (/ui or /ui/login), so
// that the page works under a path prefix.
func (g *Gate) loginForm(w http.ResponseWriter, r *http.Request, status int, msg string) {
	uiHeaders(w.Header())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
	w.WriteHeader(status)
	base := ""
	if strings.HasSuffix(r.URL.Path, "/login") {
		base = "../"
	}
	loginTemplate.Execute(w, struct{ Error, Base string }{msg, base})
}

// hashKey shows a key as a hash keyed by this process's secret: stable
// while the process runs, so the page can follow a key, and not
// reversible by trying every address or user id, which a plain hash of
// such small sets would be.
func (g *Gate) hashKey(key string) string {
	m := hmac.New(sha256.New, g.ui.keys[:])
	m.Write([]byte(key))
	return "#" + hex.EncodeToString(m.Sum(nil)[:8])
}

// csrfToken is the CSRF token of r's session, "" without a valid one: an
// HMAC of the session cookie, so that it lasts as long as the session
// and a token of one session is worth nothing in another.
func (g *Gate) csrfToken(r *http.Request) string {
	c, err := r.Cookie(uiCookie)
	if err != nil || !g.validSession(c.Value, g.adminToken(), time.Now()) {
		return ""
	}
	m := hmac.New(sha256.New, g.ui.cookie[:])
	m.Write([]byte("sluice-ui-csrf\x00" + c.Value))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// uiReset is the page's reset button: /v1/reset's reset of one key's
// bucket. A browser's session cookie opens it only with the session's
// CSRF token, as the form field csrf or the header X-CSRF-Token; a
// bearer token (a script, which no other site can make a browser send)
// needs none.
func (g *Gate) uiReset(w http.ResponseWriter, r *http.Request) {
	uiHeaders(w.Header())
	if !sameOrigin(r) {
		badRequest(w, http.StatusForbidden, "the reset button is accepted only from the live page itself")
		return
	}
	p := g.Policy()
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if err := r.ParseForm(); err != nil {
		badRequest(w, http.StatusBadRequest, "the form could not be read: send rule=<rule>&key=<key> as application/x-www-form-urlencoded, at most 4 KiB")
		return
	}
	if want := g.csrfToken(r); want != "" {
		got := cmp.Or(r.Header.Get("X-CSRF-Token"), r.PostForm.Get("csrf"))
		if !hmac.Equal([]byte(got), []byte(want)) {
			badRequest(w, http.StatusForbidden, "the reset needs the page's CSRF token (form field csrf or header X-CSRF-Token): reload the live page and press the button again")
			return
		}
	} else if !g.admin(w, r, p) {
		return
	}
	key := r.PostForm.Get("key")
	if len(key) > maxKey {
		badRequest(w, http.StatusBadRequest, fmt.Sprintf("key is %d bytes, at most %d", len(key), maxKey))
		return
	}
	g.resetBucket(w, r, p, ResetRequest{Rule: r.PostForm.Get("rule"), Key: key})
}
