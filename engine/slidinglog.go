package engine

// LogEntry is one admitted request in a sliding log: when (microseconds)
// and how much (micro-tokens).
type LogEntry struct {
	Stamp int64
	Cost  int64
}

// TakeSlidingLog decides one request against a sliding-window log at time
// now (microseconds).
//
// The log holds every admitted request of the last Period, oldest first.
// A request is admitted when the cost of the entries newer than now-Period
// plus its own stays within Capacity, so no window of Period ever admits more
// than Capacity: the count is exact, at the price of O(Capacity) state per
// key. A clock that steps back is held at the newest entry.
//
// With take set, expired entries are dropped in place and an admitted
// request is appended; the returned slice is the log to store. Without it
// (a peek) log is left untouched. A rejected request gets RetryAfter = the
// wait until enough entries expire.
func TakeSlidingLog(p *Params, log []LogEntry, now, cost int64, take bool) ([]LogEntry, Outcome) {
	eff, first := logStart(p, log, now)
	var used int64
	for _, e := range log[first:] {
		used += e.Cost
	}
	var o Outcome
	if used+cost <= p.Capacity {
		o.Allowed = true
		used += cost
		if take {
			log = log[:copy(log, log[first:])]
			log = append(log, LogEntry{Stamp: eff, Cost: cost})
			first = 0
		}
	} else {
		excess := used + cost - p.Capacity
		for _, e := range log[first:] {
			excess -= e.Cost
			if excess <= 0 {
				o.RetryAfter = e.Stamp + p.Period - now
				break
			}
		}
	}
	o.Tokens = p.Capacity - used
	switch {
	case o.Allowed && !take:
		o.ResetAfter = eff + p.Period - now
	case len(log) > first:
		o.ResetAfter = log[len(log)-1].Stamp + p.Period - now
	}
	return log, o
}

// RefundSlidingLog takes amount micro-tokens back out of the log at time
// now, from its newest entries (an entry partly refunded keeps the rest of
// its cost), after dropping the expired ones. The log is changed in place
// and the returned slice is the log to store.
func RefundSlidingLog(p *Params, log []LogEntry, now, amount int64) ([]LogEntry, Outcome) {
	_, first := logStart(p, log, now)
	log = log[:copy(log, log[first:])]
	for len(log) > 0 && amount > 0 {
		last := &log[len(log)-1]
		if last.Cost > amount {
			last.Cost -= amount
			break
		}
		amount -= last.Cost
		log = log[:len(log)-1]
	}
	var used int64
	for _, e := range log {
		used += e.Cost
	}
	o := Outcome{Allowed: true, Tokens: p.Capacity - used}
	if n := len(log); n > 0 {
		o.ResetAfter = log[n-1].Stamp + p.Period - now
	}
	return log, o
}

// logStart is the time log is decided at, now or its newest entry's when
// the clock stepped back, and the index of its first entry not expired
// then.
func logStart(p *Params, log []LogEntry, now int64) (eff int64, first int) {
	eff = now
	if n := len(log); n > 0 && log[n-1].Stamp > eff {
		eff = log[n-1].Stamp
	}
	for first < len(log) && log[first].Stamp <= eff-p.Period {
		first++
	}
	return eff, first
}
