package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/poolmetrics"
	"github.com/kvgate/kvgate/extproc/latency"
)

// PrefillBacklogName is the seconds-valued prefill backlog gauge. llm-d has
// no such series: its token-aware ScaledObject divides
// llm_d_epp_inflight_tokens by a peak prefill throughput written into the
// query, one number for every accelerator. This gauge divides each
// endpoint's live prefill backlog by the prefill speed the picker learned
// for that endpoint, so a pool mixing accelerators needs no calibration.
const PrefillBacklogName = "kvgate_endpoint_prefill_backlog_seconds"

// PrefillBacklogLabels are the gauge's labels: the pool (name), the
// endpoint, its pod's namespace when discovery knows it, and its llm-d.ai/role
// (empty for a server without a P/D role).
var PrefillBacklogLabels = []string{"name", "endpoint", "namespace", "role"}

var prefillBacklogDesc = prometheus.NewDesc(PrefillBacklogName,
	"Seconds of prefill work routed to an endpoint and not yet started or finished: its uncached prompt tokens awaiting a first token, divided by the prefill speed the picker's latency model learned for it.",
	PrefillBacklogLabels, nil)

// LatencyPredictor is what the gauge reads of the picker's latency model.
type LatencyPredictor interface {
	Predict(addr string, f latency.Features) latency.Estimate
}

// PrefillBacklog computes the gauge at scrape time. It joins two owners'
// state, the datastore's live load account and the latency model's fit,
// which is why it lives here rather than with either.
type PrefillBacklog struct {
	pool  string
	ds    *endpoints.Datastore
	model LatencyPredictor
}

// NewPrefillBacklog returns the collector for the pool's endpoints.
func NewPrefillBacklog(pool string, ds *endpoints.Datastore, model LatencyPredictor) *PrefillBacklog {
	return &PrefillBacklog{pool: pool, ds: ds, model: model}
}

// Describe implements prometheus.Collector.
func (c *PrefillBacklog) Describe(ch chan<- *prometheus.Desc) { ch <- prefillBacklogDesc }

// Collect implements prometheus.Collector. A model that learned no
// per-token prefill cost for an endpoint (fast servers and short prompts:
// its TTFT is all the step in progress) prices the backlog at 0 s, which is
// what it predicts with; the series stays, so that the ScaledObject's sum
// does not lose an endpoint.
func (c *PrefillBacklog) Collect(ch chan<- prometheus.Metric) {
	for _, e := range c.ds.All() {
		perToken := max(0, SecondsPerPrefillToken(c.model, e.Address()))
		s := float64(e.Load().PrefillTokens) * perToken
		ch <- prometheus.MustNewConstMetric(prefillBacklogDesc, prometheus.GaugeValue, s,
			c.pool, e.Name(), e.Label(poolmetrics.NamespaceLabel), e.Label(endpoints.RoleLabel))
	}
}

// speedProbe is the prompt length the speed is read at: two idle-server
// predictions this far apart differ by exactly the model's per-token
// prefill coefficient, both far enough above zero that neither is clamped
// at the model's minimum prediction.
const speedProbe = 1000

// SecondsPerPrefillToken is the model's learned prefill time per uncached
// token on the endpoint at addr (its own fit once it has enough samples,
// else the pool's, as the picker's predictions use): the slope of its
// predicted TTFT on an idle server.
func SecondsPerPrefillToken(m LatencyPredictor, addr string) float64 {
	a := m.Predict(addr, latency.Features{Prefill: speedProbe}).TTFT
	b := m.Predict(addr, latency.Features{Prefill: 2 * speedProbe}).TTFT
	return (b - a).Seconds() / speedProbe
}
