package settle_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/settle"
)

// A handle reads back as issued: limit, key, the amount charged (in
// micro-tokens, a cost of 0 being 1) and its expiry.
func TestHandleRoundTrip(t *testing.T) {
	secret := []byte(strings.Repeat("k", 32))
	exp := time.Unix(1_700_000_000, 0)
	for _, cost := range []float64{0, 2.5} {
		h, err := settle.Open(secret, settle.Issue(secret, "tokens.gold", "org:a.b", cost, exp))
		want := int64(max(cost, 1) * 1e6)
		if err != nil || h.Rule != "tokens.gold" || h.Key != "org:a.b" || h.Charged != want || h.Expires != exp.Unix() {
			t.Errorf("cost %v: %+v %v", cost, h, err)
		}
	}
	if settle.Issue(secret, strings.Repeat("r", 256), "k", 1, exp) != "" {
		t.Error("a handle for a limit name too long to write")
	}
}

// Attack: a caller alters a handle it holds (another key, a larger
// charge to be refunded, a later expiry), signs one with a key of its
// own, or sends one that is not a handle. Each is refused: altered or
// made up is ErrForged, whatever part was changed; not a handle is
// ErrMalformed.
func TestAttackForgedHandle(t *testing.T) {
	secret := []byte(strings.Repeat("k", 32))
	h := settle.Issue(secret, "tokens", "victim", 5, time.Unix(1_700_000_000, 0))
	pl64, sum64, _ := strings.Cut(h, ".")
	enc := base64.RawURLEncoding
	pl, _ := enc.DecodeString(pl64)
	for i := range pl {
		bad := []byte(string(pl))
		bad[i] ^= 1
		if _, err := settle.Open(secret, enc.EncodeToString(bad)+"."+sum64); !errors.Is(err, settle.ErrForged) {
			t.Fatalf("byte %d of the payload altered: %v, want ErrForged", i, err)
		}
	}
	if _, err := settle.Open([]byte(strings.Repeat("x", 32)), h); !errors.Is(err, settle.ErrForged) {
		t.Errorf("opened under another secret: %v", err)
	}
	if _, err := settle.Open(secret, settle.Issue([]byte("mine"), "tokens", "victim", 5, time.Now())); !errors.Is(err, settle.ErrForged) {
		t.Errorf("signed with the caller's own key: %v", err)
	}
	for _, s := range []string{"", "x", h + "x", pl64, pl64 + ".!!"} {
		if _, err := settle.Open(secret, s); !errors.Is(err, settle.ErrMalformed) {
			t.Errorf("Open(%q): %v, want ErrMalformed", s, err)
		}
	}
}
