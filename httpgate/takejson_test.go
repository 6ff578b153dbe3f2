package httpgate

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"testing"
)

// Every body parseSimpleTake reads is one decodeJSON accepts, decoded
// alike; the seeds run as an ordinary test.
func FuzzSimpleTake(f *testing.F) {
	for _, s := range []string{
		`{"rule":"per-user","key":"u1"}`,
		` { "key" : "u1" , "rule" : "per-user" , "cost" : 2.5e-3 , "reserve" : true } `,
		"{\"rule\":\"r\",\"key\":\"k\",\"reserve\":false}\n",
		`{"rule":"r","key":"k","cost":-0}`,
		`{"rule":"r","key":"k","cost":1e400}`,
		`{"rule":"r","key":"k","cost":01}`,
		`{"rule":"r","key":"k","cost":1.}`,
		`{"rule":"r","key":"k","cost":null}`,
		`{"rule":"r","rule":"s","key":"k"}`,
		`{"Rule":"r","key":"k"}`,
		`{"rule":"r","key":"k",}`,
		`{"rule":"r","key":"k"}x`,
		`{"rule":"r","key":"k"}{}`,
		`{"rule":"r","key":"\u0041"}`,
		`{"rule":"r","key":"<&>"}`,
		`{"rule":"r","key":"é"}`,
		`{"rule":"r","takes":[]}`,
		`{}`, `{`, `[]`, `null`, `""`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, ok := parseSimpleTake(data, knownR)
		if !ok {
			return
		}
		var want TakeRequest
		if msg := decodeJSON(data, &want); msg != "" {
			t.Fatalf("%q: read %+v, but encoding/json refuses it: %s", data, got, msg)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: read %+v, encoding/json %+v", data, got, want)
		}
	})
}

// appendDecision writes what json.Marshal writes, and fails where it
// fails; the seeds run as an ordinary test.
func FuzzAppendDecision(f *testing.F) {
	f.Add(true, int64(1000000000), int64(999999999), 999999999.0, int64(0), int64(1), "per-user", "", "", "", false, false, "", int64(0), "", 0)
	f.Add(false, int64(10), int64(0), -3.25, int64(1500), int64(2000), "api.gold", "2026-01-02T03:04:05.123Z", "token_bucket_exceeded", "k<1>&\"\\\x00é\xff\u2028", true, true, "0123456789abcdef0123456789abcdef", int64(30000), "handle.sig", 2)
	f.Add(true, int64(-1), int64(-5), 1e-7, int64(-1), int64(-1), "", "", "", "", false, false, "", int64(-3), "", 1)
	f.Add(true, int64(0), int64(0), 1e21, int64(0), int64(0), "r", "", "", "", false, false, "", int64(0), "", 0)
	f.Add(true, int64(0), int64(0), math.Copysign(0, -1), int64(0), int64(0), "r", "", "", "", false, false, "", int64(0), "", 0)
	f.Add(true, int64(0), int64(0), float64(1<<53-1), int64(0), int64(0), "r", "", "", "", false, false, "", int64(0), "", 0)
	f.Add(true, int64(0), int64(0), float64(-(1 << 53)), int64(0), int64(0), "r", "", "", "", false, false, "", int64(0), "", 0)
	f.Add(true, int64(0), int64(0), 1e20, int64(0), int64(0), "r", "", "", "", false, false, "", int64(0), "", 0)
	f.Add(true, int64(0), int64(0), math.NaN(), int64(0), int64(0), "r", "", "", "", false, false, "", int64(0), "", 1)
	f.Add(true, int64(0), int64(0), math.Inf(-1), int64(0), int64(0), "r", "", "", "", false, false, "", int64(0), "", 0)
	f.Fuzz(func(t *testing.T, allowed bool, limit, remaining int64, tokens float64, retry, reset int64,
		rule, retryAt, reason, key string, shadow, storeErr bool, lease string, leaseMs int64, settle string, takes int) {
		d := DecisionResponse{
			Allowed: allowed, Limit: limit, Remaining: remaining, Tokens: tokens,
			RetryAfterMs: retry, ResetAfterMs: reset, Rule: rule, RetryAt: retryAt, Reason: reason,
			Key: key, Shadow: shadow, StoreError: storeErr, Lease: lease, LeaseMs: leaseMs, Settle: settle,
		}
		// A batch: the same decision as each take, and one that differs.
		for i := range takes % 4 {
			e := d
			e.Tokens = tokens * float64(i+1) / 3
			e.Key = key[:len(key)*i/4]
			d.Takes = append(d.Takes, e)
		}
		want, werr := json.Marshal(&d)
		got, ok := appendDecision([]byte("prefix"), &d)
		switch {
		case werr != nil && ok:
			t.Fatalf("%+v: wrote %s, but json.Marshal fails: %v", d, got, werr)
		case werr == nil && !ok:
			t.Fatalf("%+v: failed, json.Marshal writes %s", d, want)
		case werr == nil && !bytes.Equal(got, append([]byte("prefix"), want...)):
			t.Fatalf("wrote\n%s\njson.Marshal writes\n%s", got, want)
		}
	})
}

// The usual bodies take the plain path (FuzzSimpleTake checks what it
// reads; this, that it reads them at all).
func TestSimpleTakeReadsTheUsualBodies(t *testing.T) {
	for _, s := range []string{
		`{"rule":"per-user","key":"u1"}`,
		`{"rule":"per-user","key":"u1","cost":2}`,
		` { "key" : "u1" , "rule" : "per-user" , "cost" : 2.5e-3 , "reserve" : true } ` + "\n",
	} {
		if _, ok := parseSimpleTake([]byte(s), nil); !ok {
			t.Errorf("%s: not read", s)
		}
	}
}

// knownR is a parseSimpleTake's known that holds the name "r".
func knownR(b []byte) string {
	if string(b) == "r" {
		return "r"
	}
	return ""
}
