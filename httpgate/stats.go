package httpgate

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/policy"
)

// Stats is the answer of GET /v1/stats: what the live page shows. Series
// hold one value per second, oldest first, for the WindowS seconds that
// start at From (Unix seconds) and end with the last second completed.
type Stats struct {
	GeneratedAt time.Time `json:"generated_at"`
	StartedAt   time.Time `json:"started_at"`
	WindowS     int       `json:"window_s"`
	From        int64     `json:"from"`
	// KeysHashed is set under ui.show_keys: false: every key is shown as
	// a hash keyed by a secret of this process.
	KeysHashed bool        `json:"keys_hashed"`
	Policy     StatsPolicy `json:"policy"`
	Store      StatsStore  `json:"store"`
	Rules      []StatsRule `json:"rules"`
	HotKeys    StatsHot    `json:"hot_keys"`
}

// StatsPolicy is where the policy in force came from.
type StatsPolicy struct {
	Source string `json:"source"`
	// Version is the start of the SHA-256 of the file in force, in hex.
	Version  string    `json:"version"`
	LoadedAt time.Time `json:"loaded_at"`
	// Changes counts the policies installed since the start (the first,
	// reloads of the file, changes of the rules table).
	Changes    int          `json:"changes"`
	LastReload *StatsReload `json:"last_reload"`
}

// StatsReload is the last reload of the file: null before the first.
type StatsReload struct {
	At      time.Time `json:"at"`
	OK      bool      `json:"ok"`
	Error   string    `json:"error,omitempty"`
	Version string    `json:"version,omitempty"`
}

// StatsStore is the store's health.
type StatsStore struct {
	// URL is the store's URL, its password hidden.
	URL string `json:"url"`
	// Calls and Errors per second, and the calls' mean and longest
	// latency in milliseconds (0 for a second without calls).
	Calls     []uint64  `json:"calls"`
	Errors    []uint64  `json:"errors"`
	LatencyMs []float64 `json:"latency_ms"`
	MaxMs     []float64 `json:"max_latency_ms"`
	// Breaker is the circuit breaker's state (closed, open, probing),
	// "" when the store exports none.
	Breaker string `json:"breaker,omitempty"`
	// Metrics are the store's own counters and gauges that it exports
	// (over-limit cache hits, breaker openings, live keys, evictions),
	// by metric name, since the start.
	Metrics map[string]float64 `json:"metrics"`
}

// StatsRule is one rule of the policy in force, or one no longer in it
// that decided within the window (InPolicy false).
type StatsRule struct {
	Name         string `json:"name"`
	InPolicy     bool   `json:"in_policy"`
	Algorithm    string `json:"algorithm,omitempty"`
	Mode         string `json:"mode,omitempty"`
	OnStoreError string `json:"on_store_error,omitempty"`
	// Keys are its limit_keys as written; none is one bucket for all.
	Keys []string `json:"keys"`
	// Source is where it is defined: FILE:LINE.
	Source string `json:"source,omitempty"`
	// Alias is the name its file gives it, in another format than
	// sluice's (envoyproxy/ratelimit's).
	Alias  string       `json:"alias,omitempty"`
	Limits []StatsLimit `json:"limits"`
	// Decisions per second; null for an outcome with none in the window.
	Allowed        []uint64 `json:"allowed"`
	Rejected       []uint64 `json:"rejected"`
	ShadowRejected []uint64 `json:"shadow_rejected"`
	StoreError     []uint64 `json:"store_error"`
	// NotCharged: the rule had room but took nothing, because another
	// rule rejected the request (not traffic it let through).
	NotCharged []uint64 `json:"not_charged"`
}

// StatsLimit is one limit of a rule: its own, or a tier's.
type StatsLimit struct {
	Name string `json:"name"`
	Tier string `json:"tier,omitempty"`
	// RatePerSecond is the long-run rate; Capacity the burst (token and
	// leaky buckets) or capacity (windows, logs).
	RatePerSecond float64 `json:"rate_per_second"`
	Capacity      float64 `json:"capacity"`
	// WindowS is a fixed window's or sliding log's period in seconds, 0
	// for the buckets.
	WindowS float64 `json:"window_s,omitempty"`
}

// StatsHot is the hottest keys by rejections and by traffic.
type StatsHot struct {
	ByRejections StatsRanking `json:"by_rejections"`
	ByTraffic    StatsRanking `json:"by_traffic"`
	// PeekError says why the keys' buckets could not be read (the store
	// did not answer); their tokens are then null.
	PeekError string `json:"peek_error,omitempty"`
}

// StatsRanking is one ranking of a Space-Saving summary (see package
// insight): over the decisions since Since, Total of them, each key's
// true count lies within Count±Error, and Error is at most ErrorBound,
// itself at most Total/Counters.
type StatsRanking struct {
	Since      time.Time     `json:"since"`
	Total      uint64        `json:"total"`
	Counters   int           `json:"counters"`
	ErrorBound uint64        `json:"error_bound"`
	Keys       []StatsHotKey `json:"keys"`
}

// StatsHotKey is one hot key, with its bucket as a peek finds it now.
type StatsHotKey struct {
	// Rule owns Limit; Key is the bucket's key (a hash under
	// keys_hashed).
	Rule  string `json:"rule"`
	Limit string `json:"limit"`
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
	// Tokens left in the bucket and the wait until one more request is
	// admitted, as a peek answers now; null when not read.
	Tokens       *float64 `json:"tokens"`
	RetryAfterMs *int64   `json:"retry_after_ms"`
	Capacity     float64  `json:"capacity"`
}

// hotKeysShown is how many keys each ranking shows, and so the most
// buckets a refresh of the page peeks at: 2*hotKeysShown.
const hotKeysShown = 10

// peekTimeout bounds the peeks of one refresh.
const peekTimeout = time.Second

func (g *Gate) stats(w http.ResponseWriter, r *http.Request) {
	if ok, wait := g.uiAuthorized(r); !ok {
		uiHeaders(w.Header())
		if wait > 0 {
			tooManyGuesses(w, wait)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
		badRequest(w, http.StatusUnauthorized, "a valid admin token is required: Authorization: Bearer <token>, or log in at /ui")
		return
	}
	p := g.Policy()
	snap := g.opts.Insight.Snapshot(hotKeysShown)
	out := Stats{
		GeneratedAt: snap.Now.UTC(),
		StartedAt:   snap.Started.UTC(),
		WindowS:     insight.Window,
		From:        snap.From,
		KeysHashed:  !p.Settings.UI.ShowKeys,
		Policy:      statsPolicy(snap.Policy),
		Store:       statsStore(snap),
		Rules:       statsRules(p, snap.Rules),
	}
	out.HotKeys.ByRejections = statsRanking(p, snap.ByRejected)
	out.HotKeys.ByTraffic = statsRanking(p, snap.ByTraffic)
	out.HotKeys.PeekError = g.peekHot(r.Context(), p, &out.HotKeys)
	if out.KeysHashed {
		for _, rk := range []*StatsRanking{&out.HotKeys.ByRejections, &out.HotKeys.ByTraffic} {
			for i := range rk.Keys {
				rk.Keys[i].Key = g.hashKey(rk.Keys[i].Key)
			}
		}
	}
	uiHeaders(w.Header())
	writeJSON(w, http.StatusOK, out)
}

func statsPolicy(pi insight.PolicyInfo) StatsPolicy {
	out := StatsPolicy{Source: pi.Source, Version: pi.Version, LoadedAt: pi.LoadedAt.UTC(), Changes: pi.Changes}
	if r := pi.LastReload; r != nil {
		out.LastReload = &StatsReload{At: r.At.UTC(), OK: r.OK, Error: r.Error, Version: r.Version}
	}
	return out
}

// breakerStates names the values of sluice_redis_breaker_state.
var breakerStates = []string{"closed", "open", "probing"}

func statsStore(snap insight.Snapshot) StatsStore {
	out := StatsStore{URL: snap.StoreURL, Calls: snap.Store.Calls, Errors: snap.Store.Errors, LatencyMs: snap.Store.MeanMs, MaxMs: snap.Store.MaxMs, Metrics: map[string]float64{}}
	for k, v := range snap.Readings {
		out.Metrics[k] = v
	}
	if v, ok := snap.Readings["sluice_redis_breaker_state"]; ok && v >= 0 && int(v) < len(breakerStates) {
		out.Breaker = breakerStates[int(v)]
	}
	return out
}

// statsRules describes the policy's rules, in file order, with their
// series, then the rules gone from the policy that decided in the window.
func statsRules(p *policy.Policy, series map[string]insight.RuleCounts) []StatsRule {
	out := []StatsRule{}
	seen := map[string]bool{}
	add := func(r *policy.Rule, alias string) {
		sr := StatsRule{Name: r.Name, InPolicy: true, Algorithm: r.Algorithm.String(), Mode: r.Mode.String(), OnStoreError: r.OnStoreError.String(), Keys: r.LimitKeys, Source: p.Source, Alias: alias, Limits: []StatsLimit{}}
		if sr.Keys == nil {
			sr.Keys = []string{}
		}
		if r.Line > 0 {
			sr.Source += ":" + strconv.Itoa(r.Line)
		}
		if len(r.Tiers) == 0 && r.Limit != nil {
			sr.Limits = append(sr.Limits, statsLimit(r.Limit, ""))
		} else if own := p.Limit(r.Name); own != nil {
			sr.Limits = append(sr.Limits, statsLimit(own, ""))
		}
		for _, t := range r.Tiers {
			sr.Limits = append(sr.Limits, statsLimit(t.Limit, t.Name))
		}
		fillSeries(&sr, series[r.Name])
		seen[r.Name] = true
		out = append(out, sr)
	}
	for _, r := range p.Rules {
		add(r, "")
	}
	for _, nr := range p.NamedRules() {
		add(nr.Rule, nr.Alias)
	}
	var gone []string
	for name := range series {
		if !seen[name] {
			gone = append(gone, name)
		}
	}
	slices.Sort(gone)
	for _, name := range gone {
		sr := StatsRule{Name: name, Keys: []string{}, Limits: []StatsLimit{}}
		fillSeries(&sr, series[name])
		out = append(out, sr)
	}
	return out
}

func fillSeries(sr *StatsRule, rc insight.RuleCounts) {
	sr.Allowed, sr.Rejected, sr.ShadowRejected, sr.StoreError, sr.NotCharged = rc.Allowed, rc.Rejected, rc.ShadowRejected, rc.StoreError, rc.NotCharged
}

func statsLimit(l *sluice.Limit, tier string) StatsLimit {
	out := StatsLimit{Name: l.Name(), Tier: tier, RatePerSecond: l.TokensPerSecond(), Capacity: l.Capacity()}
	switch l.Algorithm() {
	case sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow:
		out.WindowS = float64(l.Params().Period) / 1e6
	}
	return out
}

func statsRanking(p *policy.Policy, rk insight.Ranking) StatsRanking {
	out := StatsRanking{Since: rk.Since.UTC(), Total: rk.Total, Counters: rk.Counters, ErrorBound: rk.Bound, Keys: []StatsHotKey{}}
	for _, h := range rk.Keys {
		k := StatsHotKey{Rule: h.Limit, Limit: h.Limit, Key: h.Key, Count: h.Count, Error: h.Error}
		if rule, lim, err := p.FindLimit(h.Limit); err == nil {
			k.Rule, k.Capacity = rule.Name, lim.Capacity()
		}
		out.Keys = append(out.Keys, k)
	}
	return out
}

// peekHot reads the bucket of every key shown, in one store call that
// changes nothing (at most 2*hotKeysShown buckets), and returns why it
// could not, or "".
func (g *Gate) peekHot(ctx context.Context, p *policy.Policy, hot *StatsHot) string {
	type at struct{ rank, i int }
	var reqs []sluice.Request
	var where [][]at
	index := map[insight.Item]int{}
	for rank, rk := range []*StatsRanking{&hot.ByRejections, &hot.ByTraffic} {
		for i, k := range rk.Keys {
			it := insight.Item{Limit: k.Limit, Key: k.Key}
			if j, ok := index[it]; ok {
				where[j] = append(where[j], at{rank, i})
				continue
			}
			_, lim, err := p.FindLimit(k.Limit)
			if err != nil {
				continue // gone with a reload: nothing to read
			}
			index[it] = len(reqs)
			// One token, or the whole bucket when it holds less: what
			// the next smallest request asks.
			reqs = append(reqs, sluice.Request{Limit: lim, Key: k.Key, Cost: min(1, lim.Capacity())})
			where = append(where, []at{{rank, i}})
		}
	}
	if len(reqs) == 0 {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, min(peekTimeout, g.opts.StoreTimeout))
	defer cancel()
	_, ds, err := g.lim.PeekAll(ctx, reqs...)
	if err != nil {
		g.storeLog.Log(g.opts.Logger, "sluice-ui-peek", "", err, false)
		return "the store did not answer (the error is in the server's log)"
	}
	ranks := []*StatsRanking{&hot.ByRejections, &hot.ByTraffic}
	for j, d := range ds {
		// An admitting peek reports the tokens a take would leave.
		tokens, retry := d.Tokens, ceilMillis(d.RetryAfter)
		if d.Allowed {
			tokens += reqs[j].Cost
		}
		for _, a := range where[j] {
			k := &ranks[a.rank].Keys[a.i]
			k.Tokens, k.RetryAfterMs = &tokens, &retry
		}
	}
	return ""
}
