package envoyrls

import (
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy"
)

// rateLimitHeaders builds the RateLimit fields of the HTTP API for a
// call's verdict, so that a client behind Envoy reads the same headers as
// one talking to sluice directly; Envoy adds them to OK and OVER_LIMIT
// responses alike.
//
// ADAPTER: a small stand-in with the signature of httpgate's header
// builder; it is to be replaced by a call to httpgate.RateLimitHeaders so
// that every path emits identical headers.
func rateLimitHeaders(v policy.Verdict, identity, path string, sets []string) http.Header {
	h := make(http.Header)
	draft, trio, legacy := len(sets) == 0, len(sets) == 0, false
	for _, s := range sets {
		switch s {
		case "draft":
			draft = true
		case "trio":
			trio = true
		case "legacy":
			legacy = true
		}
	}
	var pols, states []string
	for _, r := range v.Results {
		l := r.Match.Request.Limit
		if r.Shadow || r.StoreErr != nil || l == nil {
			continue
		}
		name := strconv.Quote(l.Name())
		d := r.Decision
		pols = append(pols, name+";q="+itoa(d.Limit)+";w="+itoa(ceilSeconds(windowOf(l))))
		states = append(states, name+";r="+itoa(max(d.Remaining, 0))+";t="+itoa(ceilSeconds(resetOf(d.Allowed, d.RetryAfter, d.ResetAfter))))
	}
	if draft && len(pols) > 0 {
		h.Set("RateLimit-Policy", strings.Join(pols, ", "))
		h.Set("RateLimit", strings.Join(states, ", "))
	}
	o := v.Overall
	lim, rem, reset := itoa(o.Limit), itoa(max(o.Remaining, 0)), itoa(ceilSeconds(resetOf(v.Allowed, o.RetryAfter, o.ResetAfter)))
	if trio {
		h.Set("RateLimit-Limit", lim)
		h.Set("RateLimit-Remaining", rem)
		h.Set("RateLimit-Reset", reset)
	}
	if legacy {
		h.Set("X-RateLimit-Limit", lim)
		h.Set("X-RateLimit-Remaining", rem)
		h.Set("X-RateLimit-Reset", reset)
	}
	if !v.Allowed {
		h.Set("Retry-After", itoa(max(1, ceilSeconds(o.RetryAfter))))
	}
	return h
}

func resetOf(allowed bool, retry, reset time.Duration) time.Duration {
	if !allowed {
		return retry
	}
	return reset
}

// windowOf is the seconds a limit takes to refill from empty: the period
// of a window, capacity/rate of a bucket.
func windowOf(l *sluice.Limit) time.Duration {
	p := l.Params()
	if p.Algorithm == sluice.TokenBucket || p.Algorithm == sluice.LeakyBucket {
		return time.Duration(l.Capacity() / l.TokensPerSecond() * float64(time.Second))
	}
	return sluice.Duration(p.Period)
}

func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return s
}

// headerValues converts h in a stable order.
func headerValues(h http.Header) []*corev3.HeaderValue {
	if len(h) == 0 {
		return nil
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []*corev3.HeaderValue
	for _, k := range keys {
		for _, v := range h[k] {
			out = append(out, &corev3.HeaderValue{Key: k, Value: v})
		}
	}
	return out
}
