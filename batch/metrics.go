package batch

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the processor's series, with llm-d batch-gateway's names.
type metrics struct {
	jobs          *prometheus.CounterVec // result
	inflight      prometheus.Gauge
	maxInflight   prometheus.Gauge
	modelInflight *prometheus.GaugeVec   // model
	modelErrors   *prometheus.CounterVec // model
	modelDuration *prometheus.HistogramVec
	retries       prometheus.Counter

	mu     sync.Mutex
	models map[string]bool // model label values in use, capped
}

// maxModelLabels caps the model label's values; later models share "other".
const maxModelLabels = 256

func newMetrics(reg prometheus.Registerer, maxConcurrency int) *metrics {
	m := &metrics{
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jobs_processed_total",
			Help: "Batches that ended, by result (completed, failed, expired, cancelled)."}, []string{"result"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "processor_inflight_requests",
			Help: "Requests in flight to the gateway."}),
		maxInflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "processor_max_inflight_concurrency",
			Help: "The limit on requests in flight (--max-concurrency)."}),
		modelInflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "model_inflight_requests",
			Help: "Requests in flight, by model."}, []string{"model"}),
		modelErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "request_errors_by_model_total",
			Help: "Lines whose result is not a 2xx answer, by model."}, []string{"model"}),
		modelDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "model_request_execution_duration_seconds",
			Help: "Duration of one request to the gateway, by model.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 16)}, []string{"model"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_batch_request_retries_total",
			Help: "Requests sent again after a 429, a 503 or no answer."}),
		models: map[string]bool{},
	}
	reg.MustRegister(m.jobs, m.inflight, m.maxInflight, m.modelInflight, m.modelErrors, m.modelDuration, m.retries)
	m.maxInflight.Set(float64(maxConcurrency))
	return m
}

func (m *metrics) model(name string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.models[name] {
		return name
	}
	if len(m.models) >= maxModelLabels {
		return "other"
	}
	m.models[name] = true
	return name
}
