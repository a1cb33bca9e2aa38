package async

import (
	"github.com/prometheus/client_golang/prometheus"
)

// MetricPrefix is llm-d-async's: subsystem llm_d_async, names async_*.
const MetricPrefix = "llm_d_async_async_"

// Gate-decision reasons (label reason of gate_decisions_total).
const (
	ReasonGateClosed = "gate_closed"
	ReasonQuota      = "quota_exhausted"
	ReasonDropped    = "dropped"
	ReasonError      = "error"
)

// Metrics are llm-d-async's processor families, with its names, labels
// (queue_id, queue_name, pool_name) and buckets, so that its dashboard
// reads kvgate async unchanged.
type Metrics struct {
	requests, retries, ok, failed, expired, shed *prometheus.CounterVec
	inference, residence                         *prometheus.HistogramVec
	depth, inflight, backlog, budget             *prometheus.GaugeVec
	workers                                      *prometheus.GaugeVec
	decisions                                    *prometheus.CounterVec
	gateValue, gateThreshold, gateAvailable      *prometheus.GaugeVec
}

// NewMetrics registers the families on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	q := []string{"queue_id", "queue_name", "pool_name"}
	gl := append(append([]string{}, q...), "inference_pool")
	var cs []prometheus.Collector
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricPrefix + name, Help: help}, labels)
		cs = append(cs, c)
		return c
	}
	gauge := func(name, help string, labels []string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricPrefix + name, Help: help}, labels)
		cs = append(cs, g)
		return g
	}
	hist := func(name, help string, b []float64) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricPrefix + name, Help: help, Buckets: b}, q)
		cs = append(cs, h)
		return h
	}
	m := &Metrics{
		requests:  counter("request_total", "New async requests (first attempt only).", q),
		retries:   counter("request_retries_total", "Retry attempts.", q),
		ok:        counter("successful_requests_total", "Requests that got a successful inference response.", q),
		failed:    counter("failed_requests_total", "Requests that failed with a fatal (non-retryable) error.", q),
		expired:   counter("exceeded_deadline_requests_total", "Requests whose deadline passed before they completed.", q),
		shed:      counter("shedded_requests_total", "Attempts the gateway shed (429).", q),
		inference: hist("inference_latency_time_millis", "Milliseconds spent calling the inference gateway, per attempt.", []float64{10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000}),
		residence: hist("queue_residence_time_millis", "Milliseconds a message waited in process, from its dequeue until a worker took it.",
			[]float64{500, 1000, 2000, 5000, 10000, 30000, 60000, 120000, 300000, 600000, 1800000, 3600000, 7200000, 21600000, 43200000, 86400000}),
		depth:         gauge("queue_depth", "Messages dequeued and waiting in process for a worker.", q),
		inflight:      gauge("inflight_requests", "Requests being processed by workers (sent, awaiting a response).", q),
		backlog:       gauge("broker_backlog", "Messages in the queue's sorted set.", q),
		budget:        gauge("dispatch_budget", "Dispatch budget [0, 1] the queue's gate returned at the last poll (0: closed).", q),
		workers:       gauge("pool_worker_limit", "Configured concurrent workers of a pool.", []string{"pool_name"}),
		decisions:     counter("gate_decisions_total", "Gate decisions that prevented dispatch, by reason: gate_closed counts refused messages and polls whose budget took none while work waited.", append(append([]string{}, q...), "reason")),
		gateValue:     gauge("gate_metric_value", "Value a metric gate last read (for saturation gates 1 - saturation); the gate closes when it is <= the threshold.", gl),
		gateThreshold: gauge("gate_metric_threshold", "Threshold a metric gate compares its value against.", gl),
		gateAvailable: gauge("gate_metric_source_available", "1 when a metric gate's last evaluation read its source, 0 when it used its fallback.", gl),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// queueMetrics are one queue's series.
type queueMetrics struct {
	m                  *Metrics
	id, name, pool     string
	requests, retries  prometheus.Counter
	ok, failed         prometheus.Counter
	expired, shed      prometheus.Counter
	inference          prometheus.Observer
	residence          prometheus.Observer
	depth, inflight    prometheus.Gauge
	backlog, budget    prometheus.Gauge
	closed, gateErrors prometheus.Counter
}

func (m *Metrics) queue(id, name, pool string) *queueMetrics {
	l := []string{id, name, pool}
	qm := &queueMetrics{m: m, id: id, name: name, pool: pool,
		requests: m.requests.WithLabelValues(l...), retries: m.retries.WithLabelValues(l...),
		ok: m.ok.WithLabelValues(l...), failed: m.failed.WithLabelValues(l...),
		expired: m.expired.WithLabelValues(l...), shed: m.shed.WithLabelValues(l...),
		inference: m.inference.WithLabelValues(l...), residence: m.residence.WithLabelValues(l...),
		depth: m.depth.WithLabelValues(l...), inflight: m.inflight.WithLabelValues(l...),
		backlog: m.backlog.WithLabelValues(l...), budget: m.budget.WithLabelValues(l...),
	}
	// Every reason exists from the start, so that a query reads 0 rather
	// than nothing (llm-d-async does the same).
	for _, r := range []string{ReasonGateClosed, ReasonQuota, ReasonDropped, ReasonError} {
		m.decisions.WithLabelValues(id, name, pool, r)
	}
	qm.closed = m.decisions.WithLabelValues(id, name, pool, ReasonGateClosed)
	qm.gateErrors = m.decisions.WithLabelValues(id, name, pool, ReasonError)
	return qm
}

// observer is a metric gate's gauges for this queue.
func (q *queueMetrics) observer(inferencePool string) GateObserver {
	l := []string{q.id, q.name, q.pool, inferencePool}
	return gateGauges{q.m.gateValue.WithLabelValues(l...), q.m.gateThreshold.WithLabelValues(l...), q.m.gateAvailable.WithLabelValues(l...)}
}

type gateGauges struct{ v, t, a prometheus.Gauge }

func (g gateGauges) GateReading(v, t float64) { g.v.Set(v); g.t.Set(t) }
func (g gateGauges) GateSourceAvailable(ok bool) {
	if ok {
		g.a.Set(1)
	} else {
		g.a.Set(0)
	}
}

// round records one poll.
func (q *queueMetrics) round(r Round, waiting bool) {
	q.budget.Set(r.Budget)
	q.closed.Add(float64(r.Refused))
	q.gateErrors.Add(float64(r.GateErrors))
	if r.Take == 0 && waiting {
		q.closed.Inc()
	}
}
