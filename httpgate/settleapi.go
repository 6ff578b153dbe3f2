package httpgate

// Settlement through the decision API: an admitted /v1/take of a limit
// that settles (settle_from) answers with a handle, and /v1/settle with
// that handle and the actual cost settles the take.
//
// A handle names the limit, the key and the amount charged, with an
// expiry and a random nonce, signed with HMAC-SHA256 under the key of
// settle_secret_env (or one of this process's own). A caller can neither
// make one up, nor change the limit, key or amount of one it holds, nor
// use one after it expires: it settles only what was charged to the key
// it was charged to, and refunds at most that. Each handle settles once:
// its nonce is spent in the store (a bucket of one token that refills
// only after the handle has expired) before the settlement is made, so a
// replay is refused on every server that shares the store.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/internal/reserved"
	"github.com/sluicehq/sluice/policy"
)

// SettleRequest is the body of /v1/settle.
type SettleRequest struct {
	// Handle is the settle of a /v1/take answer.
	Handle string `json:"handle"`
	// Actual is what the request turned out to cost: a finite number >= 0.
	Actual *float64 `json:"actual"`
}

// SettleResponse is the answer of /v1/settle.
type SettleResponse struct {
	Rule string `json:"rule"`
	Key  string `json:"key"`
	// Charged is what the take charged; Actual what it cost.
	Charged float64 `json:"charged"`
	Actual  float64 `json:"actual"`
	// Refunded, Extra and Forgiven are sluice.Settlement's: tokens given
	// back, charged on top, and used beyond what the debt bound lets be
	// charged.
	Refunded float64 `json:"refunded"`
	Extra    float64 `json:"extra"`
	Forgiven float64 `json:"forgiven"`
	// Limit, Remaining, Tokens and ResetAfterMs describe the bucket after
	// the settlement, as a decision does; absent when the actual cost was
	// the charge, which changes nothing.
	Limit        *int64   `json:"limit,omitempty"`
	Remaining    *int64   `json:"remaining,omitempty"`
	Tokens       *float64 `json:"tokens,omitempty"`
	ResetAfterMs *int64   `json:"reset_after_ms,omitempty"`
}

// handleVersion opens every handle; another version is refused.
const handleVersion = 1

// handleMAC separates the handles' MACs from any other use of the key.
const handleMAC = "sluice settlement handle\x00"

// handle is what a settlement handle says.
type handle struct {
	expires int64 // Unix seconds
	charged int64 // micro-tokens
	nonce   [16]byte
	rule    string // the limit's name
	key     string
}

// nonceLimit spends handles: one token per handle's nonce, refilled only
// after ttl, by which time the handle has expired. Its name holds a space,
// which no rule's name and no sluice.NewLimit may: its buckets are apart
// from every other limit's.
func nonceLimit(ttl time.Duration) *sluice.Limit {
	l, err := reserved.NewLimit(sluice.Spec{Name: "sluice settle", Rate: 1, Period: ttl.Truncate(time.Microsecond)})
	if err != nil { // a positive whole-microsecond period always compiles
		panic(err)
	}
	return l.(*sluice.Limit)
}

// settleKey is the key handles are signed with: settle_secret_env's, else
// this process's own.
func (g *Gate) settleKey(p *policy.Policy) []byte {
	if env := p.Settings.SettleSecretEnv; env != "" {
		if k := g.opts.Getenv(env); k != "" {
			return []byte(k)
		}
	}
	return g.settle.key[:]
}

func (h *handle) payload() []byte {
	b := make([]byte, 0, 1+8+8+16+1+len(h.rule)+len(h.key))
	b = append(b, handleVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(h.expires))
	b = binary.BigEndian.AppendUint64(b, uint64(h.charged))
	b = append(b, h.nonce[:]...)
	b = append(b, byte(len(h.rule)))
	b = append(b, h.rule...)
	return append(b, h.key...)
}

func handleSum(key, payload []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(handleMAC))
	m.Write(payload)
	return m.Sum(nil)
}

// issueHandle returns the handle of req, admitted and charged req.Cost:
// "" when it cannot have one (a limit name too long to write).
func (g *Gate) issueHandle(p *policy.Policy, req sluice.Request) string {
	cost := req.Cost
	if cost == 0 {
		cost = 1
	}
	charged, err := engine.ToMicroTokens(cost)
	if err != nil || len(req.Limit.Name()) > 255 {
		return ""
	}
	h := handle{expires: g.lim.Now().Add(g.opts.SettleTTL).Unix(), charged: charged, rule: req.Limit.Name(), key: req.Key}
	if _, err := rand.Read(h.nonce[:]); err != nil {
		return ""
	}
	pl := h.payload()
	enc := base64.RawURLEncoding
	return enc.EncodeToString(pl) + "." + enc.EncodeToString(handleSum(g.settleKey(p), pl))
}

// openHandle verifies a handle and reads it. The MAC is checked before
// anything in the handle is believed.
func (g *Gate) openHandle(p *policy.Policy, s string) (handle, *inputError) {
	malformed := &inputError{http.StatusBadRequest, `"handle" is malformed: pass the "settle" of a /v1/take answer as it is`}
	pl64, sum64, ok := strings.Cut(s, ".")
	if !ok {
		return handle{}, malformed
	}
	enc := base64.RawURLEncoding
	pl, err1 := enc.DecodeString(pl64)
	sum, err2 := enc.DecodeString(sum64)
	if err1 != nil || err2 != nil || len(sum) != sha256.Size {
		return handle{}, malformed
	}
	if !hmac.Equal(sum, handleSum(g.settleKey(p), pl)) {
		return handle{}, &inputError{http.StatusForbidden, "the handle was not issued by this server (or by one sharing its settle_secret_env key), or was altered"}
	}
	if len(pl) < 1+8+8+16+1 || pl[0] != handleVersion {
		return handle{}, malformed
	}
	h := handle{expires: int64(binary.BigEndian.Uint64(pl[1:])), charged: int64(binary.BigEndian.Uint64(pl[9:]))}
	copy(h.nonce[:], pl[17:33])
	n := int(pl[33])
	if len(pl) < 34+n {
		return handle{}, malformed
	}
	h.rule, h.key = string(pl[34:34+n]), string(pl[34+n:])
	if now := g.lim.Now().Unix(); now > h.expires {
		return handle{}, &inputError{http.StatusForbidden, fmt.Sprintf("the handle expired at %s: a take is settled within %v of it", time.Unix(h.expires, 0).UTC().Format(time.RFC3339), g.opts.SettleTTL)}
	}
	return h, nil
}

// settleAPI serves /v1/settle.
func (g *Gate) settleAPI(w http.ResponseWriter, r *http.Request) {
	var body SettleRequest
	if !decodeBody(w, r, &body) {
		return
	}
	switch {
	case body.Handle == "":
		badRequest(w, http.StatusBadRequest, `"handle" is required: the "settle" of a /v1/take answer`)
		return
	case body.Actual == nil:
		badRequest(w, http.StatusBadRequest, `"actual" is required: what the request cost, a number >= 0`)
		return
	case math.IsNaN(*body.Actual) || math.IsInf(*body.Actual, 0) || *body.Actual < 0:
		badRequest(w, http.StatusBadRequest, fmt.Sprintf(`"actual" must be a finite number >= 0, got %v`, *body.Actual))
		return
	}
	p := g.Policy()
	h, ie := g.openHandle(p, body.Handle)
	if ie != nil {
		badRequest(w, ie.status, ie.msg)
		return
	}
	rule, lim, err := p.FindLimit(h.rule)
	if err != nil || rule.SettleFrom(lim) == nil {
		badRequest(w, http.StatusConflict, fmt.Sprintf("limit %q no longer settles (the policy changed since the take): the take stays charged as it was", h.rule))
		return
	}
	ctx, cancel := deadline.WithTimeout(r.Context(), g.opts.StoreTimeout)
	defer cancel()
	spent, err := g.lim.Take(ctx, sluice.Request{Limit: g.settle.nonces, Key: hex.EncodeToString(h.nonce[:])})
	if err != nil {
		g.storeLog.Log(g.opts.Logger, g.settle.nonces.Name(), h.rule, err, true)
		badRequest(w, http.StatusServiceUnavailable, "the store did not answer (the error is in the server's log); the handle may be sent again")
		return
	}
	if !spent.Allowed {
		badRequest(w, http.StatusConflict, "the handle was settled already: each take is settled once")
		return
	}
	charged := engine.FromMicroTokens(h.charged)
	s, err := g.settleOne(ctx, sluice.Request{Limit: lim, Key: h.key, Cost: charged}, *body.Actual)
	if err != nil {
		badRequest(w, http.StatusServiceUnavailable, "the store did not answer (the error is in the server's log); the take stays charged as it was, and the handle is spent")
		return
	}
	out := SettleResponse{Rule: h.rule, Key: h.key, Charged: charged, Actual: *body.Actual, Refunded: s.Refunded, Extra: s.Extra, Forgiven: s.Forgiven}
	if s.Refunded != 0 || s.Extra != 0 || s.Forgiven != 0 {
		d := s.Decision
		rem, reset := max(d.Remaining, 0), ceilMillis(d.ResetAfter)
		out.Limit, out.Remaining, out.Tokens, out.ResetAfterMs = &d.Capacity, &rem, &d.Tokens, &reset
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}
