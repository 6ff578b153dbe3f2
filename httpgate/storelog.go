package httpgate

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// StoreErrorLog logs store failures at most once a second. During an
// outage every request fails alike: a line per request would bury the log
// and cost the CPU the fallback needs, while sluice_decisions_total
// {result="store_error"} counts them all. The zero value is ready to use.
type StoreErrorLog struct {
	last atomic.Int64 // Unix second of the last line
}

// Log writes one warning for a failed store call of limit, unless one was
// written this second.
func (l *StoreErrorLog) Log(logger *slog.Logger, limit, key string, err error, denied bool) {
	now, last := time.Now().Unix(), l.last.Load()
	if now == last || !l.last.CompareAndSwap(last, now) {
		return
	}
	logger.Warn("store error (logged at most once a second; see sluice_decisions_total{result=\"store_error\"})",
		"limit", limit, "key", key, "err", err, "denied", denied)
}
