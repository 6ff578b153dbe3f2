package sluice

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/engine"
)

// Jitter is what l adds to the wait of a rejection of key (see
// Spec.Jitter): from zero to Spec.Jitter, to the microsecond, chosen by
// Spread over the limit's name, the key and, when ctx carries a Caller
// (servers attach one), the caller's user, else its address. So a
// caller's retries of one key are told one offset, and callers that share
// one key (a global limit) are spread apart. Zero when the limit has no
// jitter.
func (l *Limit) Jitter(ctx context.Context, key string) time.Duration {
	j := l.spec.Jitter
	if j <= 0 {
		return 0
	}
	who := ""
	if c, ok := CallerFrom(ctx); ok {
		who = c.User
		if who == "" && c.IP.IsValid() {
			who = c.IP.String()
		}
	}
	return time.Duration(engine.Spread(uint64(j/time.Microsecond), l.spec.Name, key, who)) * time.Microsecond
}
