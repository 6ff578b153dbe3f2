package settle

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
// only after the handle has expired, NonceLimit) before the settlement
// is made, so a replay is refused on every server that shares the store.

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/reserved"
)

// handleVersion opens every handle; another version is refused.
const handleVersion = 1

// handleMAC separates the handles' MACs from any other use of the key.
const handleMAC = "sluice settlement handle\x00"

// The errors of Open.
var (
	// ErrMalformed is a handle that is not one as Issue writes it.
	ErrMalformed = errors.New("settle: malformed handle")
	// ErrForged is a handle whose MAC is not the secret's: made up, or
	// altered.
	ErrForged = errors.New("settle: handle not signed with this secret")
)

// Handle is what a settlement handle says.
type Handle struct {
	Expires int64 // Unix seconds
	Charged int64 // micro-tokens
	Nonce   [16]byte
	Rule    string // the limit's name
	Key     string
}

// NonceLimit spends handles: one token per handle's nonce, refilled a
// minute after ttl, when its handle has expired on any clock that far
// from its issuer's. Its name holds a space, which no rule's name and no
// sluice.NewLimit may: its buckets are apart from every other limit's.
func NonceLimit(ttl time.Duration) *sluice.Limit {
	l, err := reserved.NewLimit(sluice.Spec{Name: "sluice settle", Rate: 1, Period: ttl.Truncate(time.Microsecond) + time.Minute})
	if err != nil { // a positive whole-microsecond period always compiles
		panic(err)
	}
	return l.(*sluice.Limit)
}

func (h *Handle) payload() []byte {
	b := make([]byte, 0, 1+8+8+16+1+len(h.Rule)+len(h.Key))
	b = append(b, handleVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(h.Expires))
	b = binary.BigEndian.AppendUint64(b, uint64(h.Charged))
	b = append(b, h.Nonce[:]...)
	b = append(b, byte(len(h.Rule)))
	b = append(b, h.Rule...)
	return append(b, h.Key...)
}

func handleSum(secret, payload []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(handleMAC))
	m.Write(payload)
	return m.Sum(nil)
}

// Issue returns the handle, signed with secret, of a take of cost (0 is
// 1) to key of the limit rule, good until expires: "" when it cannot have
// one (a limit name too long to write).
func Issue(secret []byte, rule, key string, cost float64, expires time.Time) string {
	cost = cmp.Or(cost, 1)
	charged, err := engine.ToMicroTokens(cost)
	if err != nil || len(rule) > 255 {
		return ""
	}
	h := Handle{Expires: expires.Unix(), Charged: charged, Rule: rule, Key: key}
	rand.Read(h.Nonce[:]) // crypto/rand.Read never fails (Go 1.24+)
	pl := h.payload()
	enc := base64.RawURLEncoding
	return enc.EncodeToString(pl) + "." + enc.EncodeToString(handleSum(secret, pl))
}

// Open verifies a handle signed with secret and reads it: ErrMalformed or
// ErrForged when it is not one. The MAC is checked before anything in the
// handle is believed; its expiry is the caller's to check.
func Open(secret []byte, s string) (Handle, error) {
	pl64, sum64, ok := strings.Cut(s, ".")
	if !ok {
		return Handle{}, ErrMalformed
	}
	enc := base64.RawURLEncoding
	pl, err1 := enc.DecodeString(pl64)
	sum, err2 := enc.DecodeString(sum64)
	if err1 != nil || err2 != nil || len(sum) != sha256.Size {
		return Handle{}, ErrMalformed
	}
	if !hmac.Equal(sum, handleSum(secret, pl)) {
		return Handle{}, ErrForged
	}
	if len(pl) < 1+8+8+16+1 || pl[0] != handleVersion {
		return Handle{}, ErrMalformed
	}
	h := Handle{Expires: int64(binary.BigEndian.Uint64(pl[1:])), Charged: int64(binary.BigEndian.Uint64(pl[9:]))}
	copy(h.Nonce[:], pl[17:33])
	n := int(pl[33])
	if len(pl) < 34+n {
		return Handle{}, ErrMalformed
	}
	h.Rule, h.Key = string(pl[34:34+n]), string(pl[34+n:])
	return h, nil
}
