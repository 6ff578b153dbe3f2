package httpgate

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/quota"
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
	// Rules, Requests and HotKeys are the whole fleet's: every process
	// that shares the store (Fleet), this one included.
	Rules    []StatsRule   `json:"rules"`
	Requests StatsRequests `json:"requests"`
	HotKeys  StatsHot      `json:"hot_keys"`
	Fleet    StatsFleet    `json:"fleet"`
	// CSRF is the token the page's own POSTs (/ui/reset) carry, bound to
	// the session cookie; absent for a request without one.
	CSRF string `json:"csrf,omitempty"`
}

// StatsRequests is the requests decided per second, each counted once
// whatever the number of rules it matched: admitted, or rejected by an
// enforce-mode rule (a store error under on_store_error: deny included).
type StatsRequests struct {
	Admitted []uint64 `json:"admitted"`
	Rejected []uint64 `json:"rejected"`
}

// StatsFleet is the processes that share the store and publish their
// statistics there (see RunFleet): over the memory store, this one alone.
type StatsFleet struct {
	// Self is this process's id.
	Self string `json:"self"`
	// Shared is whether the store shares the processes' statistics.
	Shared bool `json:"shared"`
	// MaxProcesses is the most processes listed (MaxFleet); LiveS how
	// old a process's last report may be for it to be live.
	MaxProcesses int `json:"max_processes"`
	LiveS        int `json:"live_s"`
	// Error says why the other processes could not be read (this
	// process's statistics alone are shown).
	Error     string         `json:"error,omitempty"`
	Processes []StatsProcess `json:"processes"`
}

// StatsProcess is one process of the fleet.
type StatsProcess struct {
	ID        string    `json:"id"`
	Host      string    `json:"host"`
	Self      bool      `json:"self"`
	StartedAt time.Time `json:"started_at"`
	// LastSeen is when it last published; Live whether that is at most
	// live_s ago (State "live", else "stale").
	LastSeen time.Time `json:"last_seen"`
	AgeMs    int64     `json:"age_ms"`
	Live     bool      `json:"live"`
	State    string    `json:"state"`
	// Its requests over the window and in its last second, and its share
	// of the fleet's requests over the window (0 to 1).
	Admitted    uint64  `json:"admitted"`
	Rejected    uint64  `json:"rejected"`
	AdmittedNow uint64  `json:"admitted_now"`
	RejectedNow uint64  `json:"rejected_now"`
	Share       float64 `json:"share"`
	// Truncated: it left some rules' series out of its report.
	Truncated bool `json:"truncated,omitempty"`
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
	// Lease is set for a leased limit (a lease: section): each process
	// answers a hot key from slices of its budget.
	Lease *StatsLease `json:"lease,omitempty"`
}

// StatsLease is a leased limit's settings and the bound they give.
type StatsLease struct {
	// MaxSlice is the most tokens one process holds of one key: the
	// fleet admits at most processes x MaxSlice beyond the limit (zero:
	// the limit stays exact).
	MaxSlice float64 `json:"max_slice"`
	TermS    float64 `json:"term_s"`
	HotAfter int     `json:"hot_after"`
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

// uiTokenNeeded is the 401 of the live page's data.
const uiTokenNeeded = "a valid admin token is required: Authorization: Bearer <token>, or log in at /ui"

// peekTimeout bounds the peeks of one refresh.
const peekTimeout = time.Second

func (g *Gate) stats(w http.ResponseWriter, r *http.Request) {
	if ok, wait := g.uiAuthorized(r); !ok {
		uiHeaders(w.Header())
		refuseToken(w, wait, uiTokenNeeded)
		return
	}
	p := g.Policy()
	snap := g.opts.Insight.Snapshot(hotKeysShown)
	reports, fleet := g.fleetOf(r.Context(), snap)
	rules, requests := mergeSeries(snap.From, reports)
	out := Stats{
		GeneratedAt: snap.Now.UTC(),
		StartedAt:   snap.Started.UTC(),
		WindowS:     insight.Window,
		From:        snap.From,
		KeysHashed:  !p.Settings.UI.ShowKeys,
		Policy:      statsPolicy(snap.Policy),
		Store:       statsStore(snap),
		Rules:       statsRules(p, rules),
		Requests:    requests,
		Fleet:       fleet,
		CSRF:        g.csrfToken(r),
	}
	byRejected, byTraffic := make([]insight.ReportRanking, len(reports)), make([]insight.ReportRanking, len(reports))
	for i, rep := range reports {
		byRejected[i], byTraffic[i] = rep.ByRejected, rep.ByTraffic
	}
	out.HotKeys.ByRejections = statsRanking(p, fleetRanking(insight.MergeRanking(byRejected, hotKeysShown), snap.ByRejected.Counters))
	out.HotKeys.ByTraffic = statsRanking(p, fleetRanking(insight.MergeRanking(byTraffic, hotKeysShown), snap.ByTraffic.Counters))
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

// fleetOf is this process's report of snap and the reports of the other
// processes of its fleet, first this one's, and the fleet as the page
// lists it.
func (g *Gate) fleetOf(ctx context.Context, snap insight.Snapshot) ([]insight.Report, StatsFleet) {
	own := insight.NewReport(g.fleet.id, g.fleet.host, snap)
	reports := []insight.Report{own}
	fl := StatsFleet{Self: g.fleet.id, MaxProcesses: MaxFleet, LiveS: int(FleetLive / time.Second), Processes: []StatsProcess{}}
	if v := g.fleetValues(); v != nil {
		fl.Shared = true
		ctx, cancel := context.WithTimeout(ctx, min(peekTimeout, g.opts.StoreTimeout))
		others, err := g.fleetReports(ctx, v)
		cancel()
		if err != nil {
			g.storeLog.Log(g.opts.Logger, "sluice-ui-fleet", "", err, false)
			fl.Error = "the other processes' statistics could not be read (the error is in the server's log)"
		}
		reports = append(reports, others...)
	}
	var all uint64
	for _, rep := range reports {
		all += sumOf(rep.Requests[0]) + sumOf(rep.Requests[1])
	}
	nowMs := snap.Now.UnixMilli()
	for _, rep := range reports {
		sp := StatsProcess{ID: rep.ID, Host: rep.Host, Self: rep.ID == g.fleet.id, StartedAt: time.UnixMilli(rep.Started).UTC(), LastSeen: time.UnixMilli(rep.At).UTC(),
			AgeMs: max(nowMs-rep.At, 0), Admitted: sumOf(rep.Requests[0]), Rejected: sumOf(rep.Requests[1]), Truncated: rep.Truncated}
		sp.Live = sp.Self || time.Duration(sp.AgeMs)*time.Millisecond <= FleetLive
		sp.State = "stale"
		if sp.Live {
			sp.State = "live"
		}
		if n := len(rep.Requests[0]); n > 0 {
			sp.AdmittedNow = rep.Requests[0][n-1]
		}
		if n := len(rep.Requests[1]); n > 0 {
			sp.RejectedNow = rep.Requests[1][n-1]
		}
		if all > 0 {
			sp.Share = float64(sp.Admitted+sp.Rejected) / float64(all)
		}
		fl.Processes = append(fl.Processes, sp)
	}
	return reports, fl
}

func sumOf(xs []uint64) (n uint64) {
	for _, x := range xs {
		n += x
	}
	return n
}

// mergeSeries adds up the reports' series over the window that starts
// at from: each rule's, and the requests'.
func mergeSeries(from int64, reports []insight.Report) (map[string]insight.RuleCounts, StatsRequests) {
	rules := map[string]insight.RuleCounts{}
	req := StatsRequests{Admitted: make([]uint64, insight.Window), Rejected: make([]uint64, insight.Window)}
	for _, rep := range reports {
		req.Admitted = insight.AddSeries(req.Admitted, from, rep.Requests[0], rep.From)
		req.Rejected = insight.AddSeries(req.Rejected, from, rep.Requests[1], rep.From)
		for name, s := range rep.Rules {
			rc := rules[name]
			for o, dst := range []*[]uint64{&rc.Allowed, &rc.Rejected, &rc.ShadowRejected, &rc.StoreError, &rc.NotCharged} {
				*dst = insight.AddSeries(*dst, from, s[o], rep.From)
			}
			rules[name] = rc
		}
	}
	return rules, req
}

// fleetRanking is a merged ranking as the page's rankings are.
func fleetRanking(rk insight.ReportRanking, counters int) insight.Ranking {
	out := insight.Ranking{Since: time.Unix(rk.Since, 0), Total: rk.Total, Counters: counters, Bound: rk.Bound, Keys: []insight.HotKey{}}
	for _, k := range rk.Keys {
		out.Keys = append(out.Keys, insight.HotKey{Item: insight.Item{Limit: k.Limit, Key: k.Key}, Count: k.Count, Error: k.Error})
	}
	return out
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
	maps.Copy(out.Metrics, snap.Readings)
	if v, ok := snap.Readings["sluice_redis_breaker_state"]; ok && v >= 0 && int(v) < len(breakerStates) {
		out.Breaker = breakerStates[int(v)]
	}
	return out
}

// statsRules describes the policy's rules, in file order, with their
// series, then the rules gone from the policy that decided in the window.
func statsRules(p *policy.Policy, series map[string]insight.RuleCounts) []StatsRule {
	out := []StatsRule{}
	leased := p.Leased()
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
			sr.Limits = append(sr.Limits, statsLimit(r.Limit, "", leased))
		} else if own := p.Limit(r.Name); own != nil {
			sr.Limits = append(sr.Limits, statsLimit(own, "", leased))
		}
		for _, t := range r.Tiers {
			sr.Limits = append(sr.Limits, statsLimit(t.Limit, t.Name, leased))
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
	for _, name := range slices.Sorted(maps.Keys(series)) {
		if seen[name] {
			continue // in the policy: listed above
		}
		sr := StatsRule{Name: name, Keys: []string{}, Limits: []StatsLimit{}}
		fillSeries(&sr, series[name])
		out = append(out, sr)
	}
	return out
}

func fillSeries(sr *StatsRule, rc insight.RuleCounts) {
	sr.Allowed, sr.Rejected, sr.ShadowRejected, sr.StoreError, sr.NotCharged = rc.Allowed, rc.Rejected, rc.ShadowRejected, rc.StoreError, rc.NotCharged
}

func statsLimit(l *sluice.Limit, tier string, leased map[*sluice.Limit]quota.Settings) StatsLimit {
	out := StatsLimit{Name: l.Name(), Tier: tier, RatePerSecond: l.TokensPerSecond(), Capacity: l.Capacity()}
	if set, ok := leased[l]; ok {
		d := set.WithDefaults()
		out.Lease = &StatsLease{MaxSlice: quota.Overshoot(l, set, 1), TermS: d.Term.Seconds(), HotAfter: d.HotAfter}
	}
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
	ranks := []*StatsRanking{&hot.ByRejections, &hot.ByTraffic}
	for rank, rk := range ranks {
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
	tokens, retry, problem := g.peekBuckets(ctx, "sluice-ui-peek", reqs)
	for j := range tokens {
		for _, a := range where[j] {
			k := &ranks[a.rank].Keys[a.i]
			k.Tokens, k.RetryAfterMs = &tokens[j], &retry[j]
		}
	}
	return problem
}

// peekBuckets reads the buckets of reqs in one store call that changes
// nothing: the tokens each holds (before the request, as a take finds
// them) and the wait for it. problem says why they could not be read
// ("" when they were); what names the call in the log.
func (g *Gate) peekBuckets(ctx context.Context, what string, reqs []sluice.Request) (tokens []float64, retryMs []int64, problem string) {
	if len(reqs) == 0 {
		return nil, nil, ""
	}
	ctx, cancel := context.WithTimeout(ctx, min(peekTimeout, g.opts.StoreTimeout))
	defer cancel()
	_, ds, err := g.lim.PeekAll(ctx, reqs...)
	if err != nil {
		g.storeLog.Log(g.opts.Logger, what, "", err, false)
		return nil, nil, "the store did not answer (the error is in the server's log)"
	}
	tokens, retryMs = make([]float64, len(ds)), make([]int64, len(ds))
	for i, d := range ds {
		// An admitting peek reports the tokens a take would leave.
		tokens[i], retryMs[i] = d.Tokens, ceilMillis(d.RetryAfter)
		if d.Allowed {
			tokens[i] += reqs[i].Cost
		}
	}
	return tokens, retryMs, ""
}

// StatsKey is the answer of GET /v1/stats/key?key=KEY: the key's bucket
// under every limit of the policy (each rule's own and its tiers'), as a
// peek finds it now, read from the store that the fleet shares.
type StatsKey struct {
	Key     string        `json:"key"`
	Buckets []StatsBucket `json:"buckets"`
	// Truncated: the policy has more than maxSearchLimits limits, and
	// only the first are read.
	Truncated bool `json:"truncated,omitempty"`
	// PeekError says why the buckets could not be read; their tokens are
	// then null.
	PeekError string `json:"peek_error,omitempty"`
}

// StatsBucket is one limit's bucket of the key.
type StatsBucket struct {
	Rule      string  `json:"rule"`
	Limit     string  `json:"limit"`
	Tier      string  `json:"tier,omitempty"`
	Algorithm string  `json:"algorithm"`
	Capacity  float64 `json:"capacity"`
	// Tokens left and the wait until one more request is admitted; null
	// when not read. Full: the bucket is as a key never seen finds it.
	Tokens       *float64 `json:"tokens"`
	RetryAfterMs *int64   `json:"retry_after_ms"`
}

// maxSearchLimits bounds the buckets one search reads.
const maxSearchLimits = 64

func (g *Gate) statsKey(w http.ResponseWriter, r *http.Request) {
	uiHeaders(w.Header())
	if ok, wait := g.uiAuthorized(r); !ok {
		refuseToken(w, wait, uiTokenNeeded)
		return
	}
	key := r.URL.Query().Get("key")
	if key == "" {
		badRequest(w, http.StatusBadRequest, "?key= is required: the key as the rankings show it (a client address, a user id)")
		return
	}
	if len(key) > maxKey {
		badRequest(w, http.StatusBadRequest, fmt.Sprintf("key is %d bytes, at most %d", len(key), maxKey))
		return
	}
	p := g.Policy()
	out := StatsKey{Key: key, Buckets: []StatsBucket{}}
	var reqs []sluice.Request
	for _, lim := range p.NamedLimits() {
		if len(reqs) == maxSearchLimits {
			out.Truncated = true
			break
		}
		b := StatsBucket{Rule: lim.Name(), Limit: lim.Name(), Algorithm: lim.Algorithm().String(), Capacity: lim.Capacity()}
		req := sluice.Request{Limit: lim, Key: key}
		// The request the rule itself would make of this key (its
		// reservation and debt bounds), asking what the next smallest
		// request would: one token, or the whole bucket when it holds less.
		if m, ok := p.LimitMatch(lim.Name(), key); ok {
			req = m.Request
			b.Rule = m.Rule.Name
			if m.Tier != nil {
				b.Tier = m.Tier.Name
			}
		} else if rule, _, err := p.FindLimit(lim.Name()); err == nil && rule != nil {
			b.Rule = rule.Name
		}
		req.Cost, req.Reserve = min(1, lim.Capacity()), false
		reqs = append(reqs, req)
		out.Buckets = append(out.Buckets, b)
	}
	tokens, retry, problem := g.peekBuckets(r.Context(), "sluice-ui-search", reqs)
	for i := range tokens {
		out.Buckets[i].Tokens, out.Buckets[i].RetryAfterMs = &tokens[i], &retry[i]
	}
	out.PeekError = problem
	writeJSON(w, http.StatusOK, out)
}
