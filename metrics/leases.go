package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/quota"
)

// LeaseStats is what reports leased quotas: a quota.Store.
type LeaseStats interface {
	Stats() []quota.RuleStats
}

// WatchLeases exports the leased quotas of q per leased rule (limit):
// the slices taken, returned and dropped, the tokens held now (what this
// process may still admit beyond the store's count, its part of the
// overshoot at this moment) and the max slice (its part of the bound).
func (m *Metrics) WatchLeases(q LeaseStats) {
	if m == nil || q == nil {
		return
	}
	m.reg.MustRegister(&leaseCollector{q: q})
}

var (
	leaseTaken = prometheus.NewDesc("sluice_lease_slices_taken_total",
		"Slices of a leased rule's budget taken from the store by this process.", []string{"rule"}, nil)
	leaseReturned = prometheus.NewDesc("sluice_lease_slices_returned_total",
		"Slices that ended with tokens left and gave them back to the store (term over, key idle, reload, shutdown).", []string{"rule"}, nil)
	leaseDropped = prometheus.NewDesc("sluice_lease_slices_dropped_total",
		"Slices that ended with tokens that could not go back (a fixed window's near its end, a failed refund, a reset): under-admission.", []string{"rule"}, nil)
	leaseHeld = prometheus.NewDesc("sluice_lease_tokens_held",
		"Tokens held now in this process's slices of a leased rule: the most it may admit beyond the store's count at this moment (its overshoot estimate).", []string{"rule"}, nil)
	leaseMaxSlice = prometheus.NewDesc("sluice_lease_max_slice_tokens",
		"A leased rule's max slice: the most tokens one process holds of one key, its part of the overshoot bound (processes x max slice).", []string{"rule"}, nil)
)

type leaseCollector struct{ q LeaseStats }

func (c *leaseCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{leaseTaken, leaseReturned, leaseDropped, leaseHeld, leaseMaxSlice} {
		ch <- d
	}
}

func (c *leaseCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.q.Stats() {
		ch <- prometheus.MustNewConstMetric(leaseTaken, prometheus.CounterValue, float64(st.Taken), st.Rule)
		ch <- prometheus.MustNewConstMetric(leaseReturned, prometheus.CounterValue, float64(st.Returned), st.Rule)
		ch <- prometheus.MustNewConstMetric(leaseDropped, prometheus.CounterValue, float64(st.Dropped), st.Rule)
		ch <- prometheus.MustNewConstMetric(leaseHeld, prometheus.GaugeValue, st.Held, st.Rule)
		ch <- prometheus.MustNewConstMetric(leaseMaxSlice, prometheus.GaugeValue, st.MaxSlice, st.Rule)
	}
}
