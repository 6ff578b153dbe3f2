package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// shaping holds the collectors of what sluice does in front of an
// upstream: the adaptive rates and the queues of held requests.
type shaping struct {
	rate       *prometheus.GaugeVec
	minRate    *prometheus.GaugeVec
	queued     *prometheus.GaugeVec
	queueDelay *prometheus.HistogramVec
}

func newShaping(reg *prometheus.Registry) *shaping {
	s := &shaping{
		rate: newGaugeVec("sluice_adaptive_rate",
			"The current rate of an adaptive limit, in tokens per second, by limit (a rule, or RULE.TIER).", "rule"),
		// The floor beside the rate: an alert on a rate pinned to its
		// floor (the upstream keeps failing its target) needs no copy
		// of the policy's bounds.
		minRate: newGaugeVec("sluice_adaptive_min_rate",
			"The floor of an adaptive limit's rate (its min), in tokens per second, by limit (a rule, or RULE.TIER).", "rule"),
		queued: newGaugeVec("sluice_queued", "Requests this process holds for their turn, by limit.", "rule"),
		queueDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_queue_delay_seconds",
			Help:    "The wait for its turn that each admitted request of a limit that holds requests was given (0 for none), by limit.",
			Buckets: []float64{0, .001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"rule"}),
	}
	reg.MustRegister(s.rate, s.minRate, s.queued, s.queueDelay)
	return s
}

// AdaptiveRate records the current rate of the adaptive limit rule and
// its floor, in tokens per second.
func (m *Metrics) AdaptiveRate(rule string, perSecond, minPerSecond float64) {
	if m == nil {
		return
	}
	m.shaping.rate.WithLabelValues(rule).Set(perSecond)
	m.shaping.minRate.WithLabelValues(rule).Set(minPerSecond)
}

// Queued records how many requests rule's queue holds now.
func (m *Metrics) Queued(rule string, n int64) {
	if m == nil {
		return
	}
	m.shaping.queued.WithLabelValues(rule).Set(float64(n))
}

// QueueDelay records the wait for its turn that a request admitted by
// rule was given.
func (m *Metrics) QueueDelay(rule string, d time.Duration) {
	if m == nil {
		return
	}
	m.shaping.queueDelay.WithLabelValues(rule).Observe(d.Seconds())
}
