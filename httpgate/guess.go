package httpgate

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/policy"
)

// Token guesses. Every admin token a client presents (the live page's
// login, its bearer token and ?token=, /v1/stats, /v1/reset) is charged
// to the client's address in a bucket of the gate's own, in memory apart
// from the policy's store, before it is compared: a right token gets its
// charge back, a wrong one keeps it. Once an address has spent the
// bucket, a presented token is refused unread, a 429 with Retry-After, so
// a brute force gets at most GuessBurst tries and then GuessBurst per
// GuessPeriod per address, however many it sends at once. The decision
// API's token (api_token_env) is presented by services on every call, many
// at once: it is compared while the address has guesses left and only a
// wrong one is charged, so that concurrent right ones never use the
// bucket up; wrong ones sent all at once may be compared a few more times
// than GuessBurst before their charges land. A session cookie is not a
// guess: it is an HMAC no client can make up.
const (
	GuessBurst  = 10
	GuessPeriod = time.Minute
	// maxGuessKeys bounds the addresses remembered (about 84 bytes each).
	maxGuessKeys = 100_000
)

// guessLimit is the bucket of each address's token guesses.
var guessLimit = sluice.MustLimit(sluice.Spec{Name: "sluice-token-guesses", Rate: GuessBurst, Period: GuessPeriod, Capacity: GuessBurst})

// guesses holds the addresses' buckets.
type guesses struct{ lim *sluice.Limiter }

// newGuesses keeps the buckets on clock: the gate's limiter, whose Now is
// its Options.Clock's (a test's manual clock) or the system's.
func newGuesses(clock sluice.Clock) *guesses {
	return &guesses{sluice.NewWithOptions(memory.New(memory.Options{MaxKeys: maxGuessKeys, PreciseClock: true, Clock: clock}), sluice.Options{Clock: clock})}
}

// guessKey is who guesses: r's client address as the policy resolves it
// (through trusted_proxies), IPv6 by the policy's prefix, as ip:address
// keys it.
func (g *Gate) guessKey(r *http.Request) string {
	p := g.Policy()
	if a := p.FromHTTP(r).ClientIP; a.IsValid() {
		return policy.AddressKey(a, p.Settings.IPv6Prefix)
	}
	return "unknown"
}

// checkToken reports whether got is want (tokenMatches), charging the
// guess to r's client first. wait > 0 says r's client is out of guesses
// and got was not compared: answer tooManyGuesses. Nothing presented is
// no guess.
func (g *Gate) checkToken(r *http.Request, got, want string) (ok bool, wait time.Duration) {
	return g.guessToken(r, got, want, engine.OpTake)
}

// checkServiceToken is checkToken for the decision API's token, which
// charges wrong tokens only (see above).
func (g *Gate) checkServiceToken(r *http.Request, got, want string) (ok bool, wait time.Duration) {
	return g.guessToken(r, got, want, engine.OpPeek)
}

// guessToken is checkToken, asking the address's bucket with op first:
// OpTake charges every guess and refunds a right one, OpPeek charges a
// wrong one after the comparison.
func (g *Gate) guessToken(r *http.Request, got, want string, op engine.Op) (ok bool, wait time.Duration) {
	if got == "" || want == "" {
		return false, 0
	}
	req := sluice.Request{Limit: guessLimit, Key: g.guessKey(r)}
	ctx := context.WithoutCancel(r.Context()) // an in-memory store: no deadline to keep
	ask := g.guess.lim.Take
	if op == engine.OpPeek {
		ask = g.guess.lim.Peek
	}
	d, err := ask(ctx, req)
	if err != nil {
		// The memory store fails only on a bad request, which this is not;
		// closed, as a wrong token is.
		return false, GuessPeriod
	}
	if !d.Allowed {
		return false, max(d.RetryAfter, time.Second)
	}
	switch matched := tokenMatches(got, want); {
	case matched && op == engine.OpTake:
		g.guess.lim.Refund(ctx, req)
		return true, 0
	case !matched && op == engine.OpPeek:
		g.guess.lim.Take(ctx, req)
		return false, 0
	default:
		return matched, 0
	}
}

// tooManyGuesses answers a client out of token guesses.
func tooManyGuesses(w http.ResponseWriter, wait time.Duration) {
	secs := int64((wait + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	w.Header().Set("Cache-Control", "no-store")
	writeProblem(w, Problem{
		Status:     http.StatusTooManyRequests,
		Detail:     "too many wrong tokens from this address: the token was not checked; try again after Retry-After seconds",
		RetryAfter: secs,
	})
}

// refuseToken answers a request whose token was refused: tooManyGuesses
// after wait, else 401 saying need.
func refuseToken(w http.ResponseWriter, wait time.Duration, need string) {
	if wait > 0 {
		tooManyGuesses(w, wait)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
	badRequest(w, http.StatusUnauthorized, need)
}
