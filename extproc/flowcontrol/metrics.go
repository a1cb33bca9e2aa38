package flowcontrol

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/metrics/seriescache"
)

// Recorder receives the layer's observations. The Controller calls it with
// its lock held: implementations must be quick and must not call back.
type Recorder interface {
	// Queued adds n requests of bytes to req's flow's queue gauges.
	Queued(req *Request, n int, bytes int64)
	// Finished counts a request's final outcome and its time in the layer.
	Finished(req *Request, o Outcome, queued time.Duration)
	EnqueueDuration(key FlowKey, o Outcome, d time.Duration)
	DispatchCycle(d time.Duration)
	// PoolSaturation sets one stage's saturation; present false removes the
	// stage (the pool has no server in it).
	PoolSaturation(stage string, v float64, present bool)
	// StaleEndpoints is the detector's count of endpoints with missing or
	// stale metrics.
	StaleEndpoints(detector string, n int)
	BandUtilization(priority int, requests, bytes float64)
	// GlobalUtilization is the global caps' occupancy; a negative value is
	// a cap that is not set.
	GlobalUtilization(requests, bytes float64)
	Revoked(priority int)
	Revocation(outcome string, d time.Duration)
	ReclaimTarget(v float64)
	PendingReclaim(v float64)
}

type nopRecorder struct{}

func (nopRecorder) Queued(*Request, int, int64)                     {}
func (nopRecorder) Finished(*Request, Outcome, time.Duration)       {}
func (nopRecorder) EnqueueDuration(FlowKey, Outcome, time.Duration) {}
func (nopRecorder) DispatchCycle(time.Duration)                     {}
func (nopRecorder) PoolSaturation(string, float64, bool)            {}
func (nopRecorder) StaleEndpoints(string, int)                      {}
func (nopRecorder) BandUtilization(int, float64, float64)           {}
func (nopRecorder) GlobalUtilization(float64, float64)              {}
func (nopRecorder) Revoked(int)                                     {}
func (nopRecorder) Revocation(string, time.Duration)                {}
func (nopRecorder) ReclaimTarget(float64)                           {}
func (nopRecorder) PendingReclaim(float64)                          {}

// Metric name prefixes: llm-d's current one and the GIE-era twin that
// dashboards still query (llm-d emits both).
const (
	PrefixLLMD = "llm_d_epp_"
	PrefixGIE  = "inference_extension_"
)

// Label-value bounds: fairness ids and model names come from clients.
const (
	MaxFairnessLabels = 1000
	MaxModelLabels    = 256
	otherLabel        = "other"
)

// Metrics is the Prometheus Recorder: the flow_control_* families of llm-d's
// router under both prefixes (the stale-endpoint and eviction families
// under llm_d_epp_ only, as llm-d has them).
type Metrics struct {
	pool string

	queueDuration, enqueueDuration, dispatchCycle [2]*prometheus.HistogramVec
	queueSize, queueBytes, saturation             [2]*prometheus.GaugeVec
	capReq, capBytes, globalReq, globalBytes      [2]*prometheus.GaugeVec
	requests                                      [2]*prometheus.CounterVec
	stale, reclaimTarget, pendingReclaim          *prometheus.GaugeVec
	revocationsIssued, revocations                *prometheus.CounterVec
	confirmation                                  prometheus.Histogram

	mu       sync.Mutex
	fairness map[string]struct{}
	models   map[string]struct{}

	// The resolved series of the label sets written per request (queue
	// gauges, outcome, enqueue time) and per dispatch cycle (band, stage
	// and detector gauges, the cycle's histogram), each under both
	// prefixes: every WithLabelValues hashes its labels and takes its
	// vector's lock, a dozen times per request.
	queues   *seriescache.Cache[queueKey, [2]queueSeries]
	outcomes *seriescache.Cache[outcomeKey, [2]outcomeSeries]
	enqueues *seriescache.Cache[enqueueKey, [2]prometheus.Observer]
	bands    *seriescache.Cache[int, [2]bandSeries]
	stages   *seriescache.Cache[string, [2]prometheus.Gauge]
	stales   *seriescache.Cache[string, prometheus.Gauge]
	cycle    [2]prometheus.Observer
}

// maxCachedSeries bounds each label-set cache; the client-controlled
// values in the keys (fairness ids, models) are bounded before they get
// there (MaxFairnessLabels, MaxModelLabels), priorities are not.
const maxCachedSeries = 4096

// maxCachedFixed bounds the caches of the label sets the layer itself
// names: dispatch stages and the detector.
const maxCachedFixed = 16

// Label sets after bounding, and their series.
type (
	queueKey struct {
		fairness, model, target string
		priority                int
	}
	queueSeries struct{ size, bytes prometheus.Gauge }
	outcomeKey  struct {
		queueKey
		outcome Outcome
	}
	outcomeSeries struct {
		duration prometheus.Observer
		requests prometheus.Counter
	}
	enqueueKey struct {
		fairness string
		priority int
		outcome  Outcome
	}
	bandSeries struct{ requests, bytes prometheus.Gauge }
)

// queueBuckets span a dispatch in microseconds to a minute-long TTL.
var queueBuckets = []float64{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

var cycleBuckets = []float64{0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05}

// NewMetrics registers the families on reg for the pool named pool.
func NewMetrics(reg prometheus.Registerer, pool string) (*Metrics, error) {
	m := &Metrics{pool: pool, fairness: map[string]struct{}{}, models: map[string]struct{}{}}
	var cs []prometheus.Collector
	for i, p := range []string{PrefixLLMD, PrefixGIE} {
		h := func(name, help string, b []float64, labels ...string) *prometheus.HistogramVec {
			v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: p + name, Help: help, Buckets: b}, labels)
			cs = append(cs, v)
			return v
		}
		g := func(name, help string, labels ...string) *prometheus.GaugeVec {
			v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: p + name, Help: help}, labels)
			cs = append(cs, v)
			return v
		}
		m.queueDuration[i] = h("flow_control_request_queue_duration_seconds", "Time a request spent in the flow-control layer, from enqueue to its final outcome.", queueBuckets, "fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name")
		m.enqueueDuration[i] = h("flow_control_request_enqueue_duration_seconds", "Time taken to enqueue a request (capacity checks and queue insertion).", cycleBuckets, "fairness_id", "priority", "outcome")
		m.dispatchCycle[i] = h("flow_control_dispatch_cycle_duration_seconds", "Time taken by one dispatch cycle.", cycleBuckets)
		m.queueSize[i] = g("flow_control_queue_size", "Requests held in the flow-control queue.", "fairness_id", "priority", "inference_pool", "model_name", "target_model_name")
		m.queueBytes[i] = g("flow_control_queue_bytes", "Bytes of the requests held in the flow-control queue.", "fairness_id", "priority", "inference_pool", "model_name", "target_model_name")
		m.saturation[i] = g("flow_control_pool_saturation", "Pool saturation gating dispatch, per stage (prefill, decode; effective = the larger, the gating value); 1.0 is the set point, not clamped.", "inference_pool", "stage")
		m.capReq[i] = g("flow_control_capacity_utilization_requests", "Fraction of a priority band's request capacity occupied.", "priority", "inference_pool")
		m.capBytes[i] = g("flow_control_capacity_utilization_bytes", "Fraction of a priority band's byte capacity occupied.", "priority", "inference_pool")
		m.globalReq[i] = g("flow_control_global_capacity_utilization_requests", "Fraction of the global request capacity occupied (only with a global maxRequests).", "inference_pool")
		m.globalBytes[i] = g("flow_control_global_capacity_utilization_bytes", "Fraction of the global byte capacity occupied (only with a global maxBytes).", "inference_pool")
		m.requests[i] = prometheus.NewCounterVec(prometheus.CounterOpts{Name: p + "flow_control_requests_total", Help: "Requests processed by the flow-control layer, by final outcome."}, []string{"outcome", "priority", "inference_pool"})
		cs = append(cs, m.requests[i])
	}
	m.stale = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: PrefixLLMD + "flow_control_stale_endpoints", Help: "Candidate endpoints whose metrics are missing or older than the staleness threshold at the last saturation evaluation."}, []string{"detector"})
	m.reclaimTarget = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: PrefixLLMD + "flow_control_reclaim_target", Help: "Saturation the last eviction decision aimed to reclaim."}, []string{"inference_pool"})
	m.pendingReclaim = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: PrefixLLMD + "flow_control_pending_reclaim", Help: "Saturation credit of revocations awaiting confirmation."}, []string{"inference_pool"})
	m.revocationsIssued = prometheus.NewCounterVec(prometheus.CounterOpts{Name: PrefixLLMD + "flow_control_revocations_issued_total", Help: "In-flight sheddable requests revoked to free capacity."}, []string{"priority", "inference_pool"})
	m.revocations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: PrefixLLMD + "flow_control_revocations_total", Help: "Revocations by outcome (confirmed, timed_out)."}, []string{"outcome", "inference_pool"})
	m.confirmation = prometheus.NewHistogram(prometheus.HistogramOpts{Name: PrefixLLMD + "flow_control_revocation_confirmation_seconds", Help: "Time from a revocation to the release of the revoked request's load.", Buckets: queueBuckets})
	cs = append(cs, m.stale, m.reclaimTarget, m.pendingReclaim, m.revocationsIssued, m.revocations, m.confirmation)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.resolveSeries()
	return m, nil
}

// resolveSeries makes the series caches; each label set's series are
// resolved at its first write, so that they appear in /metrics only then,
// as with WithLabelValues.
func (m *Metrics) resolveSeries() {
	m.queues = seriescache.New(maxCachedSeries, func(k queueKey) *[2]queueSeries {
		var s [2]queueSeries
		p := strconv.Itoa(k.priority)
		for i := range s {
			s[i] = queueSeries{m.queueSize[i].WithLabelValues(k.fairness, p, m.pool, k.model, k.target), m.queueBytes[i].WithLabelValues(k.fairness, p, m.pool, k.model, k.target)}
		}
		return &s
	})
	m.outcomes = seriescache.New(maxCachedSeries, func(k outcomeKey) *[2]outcomeSeries {
		var s [2]outcomeSeries
		p, o := strconv.Itoa(k.priority), k.outcome.String()
		for i := range s {
			s[i] = outcomeSeries{m.queueDuration[i].WithLabelValues(k.fairness, p, o, m.pool, k.model, k.target), m.requests[i].WithLabelValues(o, p, m.pool)}
		}
		return &s
	})
	m.enqueues = seriescache.New(maxCachedSeries, func(k enqueueKey) *[2]prometheus.Observer {
		var s [2]prometheus.Observer
		p, o := strconv.Itoa(k.priority), k.outcome.String()
		for i := range s {
			s[i] = m.enqueueDuration[i].WithLabelValues(k.fairness, p, o)
		}
		return &s
	})
	m.bands = seriescache.New(maxCachedSeries, func(priority int) *[2]bandSeries {
		var s [2]bandSeries
		p := strconv.Itoa(priority)
		for i := range s {
			s[i] = bandSeries{m.capReq[i].WithLabelValues(p, m.pool), m.capBytes[i].WithLabelValues(p, m.pool)}
		}
		return &s
	})
	m.stages = seriescache.New(maxCachedFixed, func(stage string) *[2]prometheus.Gauge {
		var s [2]prometheus.Gauge
		for i := range s {
			s[i] = m.saturation[i].WithLabelValues(m.pool, stage)
		}
		return &s
	})
	m.stales = seriescache.New(maxCachedFixed, func(detector string) *prometheus.Gauge {
		g := m.stale.WithLabelValues(detector)
		return &g
	})
	// The cycle histogram has no labels: its one series is resolved now,
	// and exported from the start, as an unlabelled histogram is.
	for i := range m.cycle {
		m.cycle[i] = m.dispatchCycle[i].WithLabelValues()
	}
}

func bounded(set map[string]struct{}, v string, limit int) string {
	if _, ok := set[v]; ok {
		return v
	}
	if len(set) >= limit {
		return otherLabel
	}
	set[v] = struct{}{}
	return v
}

// queueKey is req's label set, bounded.
func (m *Metrics) queueKey(req *Request) queueKey {
	m.mu.Lock()
	defer m.mu.Unlock()
	return queueKey{bounded(m.fairness, req.FairnessID, MaxFairnessLabels), bounded(m.models, req.Model, MaxModelLabels), bounded(m.models, req.TargetModel, MaxModelLabels), req.Priority}
}

// Queued implements Recorder.
func (m *Metrics) Queued(req *Request, n int, bytes int64) {
	for _, s := range m.queues.Get(m.queueKey(req)) {
		s.size.Add(float64(n))
		s.bytes.Add(float64(bytes))
	}
}

// Finished implements Recorder.
func (m *Metrics) Finished(req *Request, o Outcome, queued time.Duration) {
	for _, s := range m.outcomes.Get(outcomeKey{m.queueKey(req), o}) {
		s.duration.Observe(queued.Seconds())
		s.requests.Inc()
	}
}

// EnqueueDuration implements Recorder.
func (m *Metrics) EnqueueDuration(key FlowKey, o Outcome, d time.Duration) {
	m.mu.Lock()
	f := bounded(m.fairness, key.FairnessID, MaxFairnessLabels)
	m.mu.Unlock()
	for _, s := range m.enqueues.Get(enqueueKey{f, key.Priority, o}) {
		s.Observe(d.Seconds())
	}
}

// DispatchCycle implements Recorder.
func (m *Metrics) DispatchCycle(d time.Duration) {
	for _, s := range m.cycle {
		s.Observe(d.Seconds())
	}
}

// PoolSaturation implements Recorder.
func (m *Metrics) PoolSaturation(stage string, v float64, present bool) {
	if !present {
		// The cached series would no longer be exported: forget them.
		m.stages.Delete(stage)
		for i := range 2 {
			m.saturation[i].DeleteLabelValues(m.pool, stage)
		}
		return
	}
	for _, s := range m.stages.Get(stage) {
		s.Set(v)
	}
}

// StaleEndpoints implements Recorder.
func (m *Metrics) StaleEndpoints(detector string, n int) {
	(*m.stales.Get(detector)).Set(float64(n))
}

// BandUtilization implements Recorder.
func (m *Metrics) BandUtilization(priority int, requests, bytes float64) {
	for _, s := range m.bands.Get(priority) {
		s.requests.Set(requests)
		s.bytes.Set(bytes)
	}
}

// GlobalUtilization implements Recorder.
func (m *Metrics) GlobalUtilization(requests, bytes float64) {
	for i := range 2 {
		if requests >= 0 {
			m.globalReq[i].WithLabelValues(m.pool).Set(requests)
		}
		if bytes >= 0 {
			m.globalBytes[i].WithLabelValues(m.pool).Set(bytes)
		}
	}
}

// Revoked implements Recorder.
func (m *Metrics) Revoked(priority int) {
	m.revocationsIssued.WithLabelValues(strconv.Itoa(priority), m.pool).Inc()
}

// Revocation implements Recorder.
func (m *Metrics) Revocation(outcome string, d time.Duration) {
	m.revocations.WithLabelValues(outcome, m.pool).Inc()
	if outcome == "confirmed" {
		m.confirmation.Observe(d.Seconds())
	}
}

// ReclaimTarget implements Recorder.
func (m *Metrics) ReclaimTarget(v float64) { m.reclaimTarget.WithLabelValues(m.pool).Set(v) }

// PendingReclaim implements Recorder.
func (m *Metrics) PendingReclaim(v float64) { m.pendingReclaim.WithLabelValues(m.pool).Set(v) }
