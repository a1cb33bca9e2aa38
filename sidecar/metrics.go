package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/bytebudget"
)

// metrics are llm-d's llm_d_disagg_sidecar_* series (names, labels and
// buckets as its pd-sidecar exports them) plus kvgate's SSRF refusals,
// P/D pairs and replay buffer.
type metrics struct {
	requests *prometheus.CounterVec   // api_type
	disagg   *prometheus.CounterVec   // connector
	encode   *prometheus.HistogramVec // connector
	prefill  *prometheus.HistogramVec // connector
	decode   *prometheus.HistogramVec // connector
	errors   *prometheus.CounterVec   // connector, stage
	denied   *prometheus.CounterVec   // stage
	pairs    *prometheus.CounterVec   // prefiller
	// replayFull counts relayed requests whose body was not kept for a
	// replay because --replay-buffer-bytes was spent.
	replayFull prometheus.Counter
	// bodyBudgetFull counts P/D requests refused (503) because
	// --body-budget-bytes was spent.
	bodyBudgetFull prometheus.Counter
}

// Stage labels of request_errors_total and of the SSRF refusals.
const (
	stageEncode  = "encode"
	stagePrefill = "prefill"
	stageDecode  = "decode"
	stageKVPull  = "kv-source"
)

var latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// newMetrics registers the series; replay is the replay buffer whose use
// is exported (nil: none), bodies the P/D bodies' budget.
func newMetrics(reg prometheus.Registerer, replay, bodies *bytebudget.Budget) *metrics {
	const sub = "llm_d_disagg_sidecar"
	hist := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: sub, Name: name, Help: help, Buckets: latencyBuckets}, []string{"connector"})
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub, Name: "requests_total",
			Help: "Total requests handled by the sidecar, by OpenAI API type."}, []string{"api_type"}),
		disagg: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub, Name: "disagg_requests_total",
			Help: "Total requests routed through disaggregation, by connector."}, []string{"connector"}),
		encode:  hist("encode_duration_seconds", "Encode stage latency in seconds, by connector."),
		prefill: hist("prefill_duration_seconds", "Prefill stage latency in seconds, by connector."),
		decode:  hist("decode_duration_seconds", "Decode stage latency in seconds, by connector."),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub, Name: "request_errors_total",
			Help: "Total prefill/decode stage errors, by connector and stage."}, []string{"connector", "stage"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_sidecar_ssrf_denied_total",
			Help: "Targets named by routing headers that SSRF protection refused (not pool members), by stage."}, []string{"stage"}),
		pairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_sidecar_pd_requests_total",
			Help: "Requests whose prefill leg ran on prefiller (the first 2,048 prefillers by address, later ones as other) and whose decode leg ran here."}, []string{"prefiller"}),
		replayFull: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_sidecar_replay_buffer_full_total",
			Help: "Relayed requests whose body was not kept for a stale-connection replay because --replay-buffer-bytes was spent: relayed all the same, not replayable."}),
		bodyBudgetFull: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_sidecar_body_budget_full_total",
			Help: "P/D requests refused with 503 because the request bodies held for rewriting had spent --body-budget-bytes."}),
	}
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_sidecar_replay_buffer_bytes",
		Help: "Bytes of relayed request bodies kept now for a stale-connection replay, at most --replay-buffer-bytes."},
		func() float64 { return float64(replay.Used()) })
	bodyBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_sidecar_body_budget_bytes",
		Help: "Bytes of P/D request bodies held now while their legs are rewritten, at most --body-budget-bytes."},
		func() float64 { return float64(bodies.Used()) })
	reg.MustRegister(m.requests, m.disagg, m.encode, m.prefill, m.decode, m.errors, m.denied, m.pairs, m.replayFull, held,
		m.bodyBudgetFull, bodyBytes)
	return m
}
