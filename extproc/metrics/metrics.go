// Package metrics defines the picker's request and scheduler metrics under
// the names users' dashboards already use: GIE's inference_objective_* and
// inference_extension_*, and llm-d's llm_d_epp_*. Pool and endpoint gauges
// live with the endpoint datastore that owns that state.
//
// Everything registers on a Registerer the binary passes in; nothing touches
// the global Prometheus registry.
package metrics

import (
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Metrics records per-request and per-decision observations.
type Metrics struct {
	requests      *prometheus.CounterVec
	errors        *prometheus.CounterVec
	ttft          []*prometheus.HistogramVec
	tpot          []*prometheus.HistogramVec
	itl           *prometheus.HistogramVec
	inputTokens   *prometheus.HistogramVec
	outputTokens  *prometheus.HistogramVec
	cachedTokens  []*prometheus.HistogramVec
	schedulerE2E  []prometheus.Histogram
	pluginLatency []*prometheus.HistogramVec
	prefixHit     []*prometheus.HistogramVec
	predicted     *prometheus.HistogramVec
	predictionErr *prometheus.HistogramVec
	predTTFT      *prometheus.HistogramVec
	predTPOT      *prometheus.HistogramVec
	latencyErr    *prometheus.HistogramVec

	// pluginObservers caches the label lookups of plugin timings, which run
	// several times per request on the hot path. Bounded by the number of
	// configured plugins × extension points.
	mu              sync.RWMutex
	pluginObservers map[pluginKey][]prometheus.Observer

	// models bounds the model-name label values: the names come from
	// clients, and each new one would create series for good.
	modelMu sync.Mutex
	models  map[string]struct{}
}

// MaxModelLabels is how many distinct model names get their own series;
// later ones are counted under OtherModel.
// Names longer than MaxLabelValueBytes (or not UTF-8) are counted under
// OtherModel too: 256 names of a megabyte each grew /metrics past a
// gigabyte.
const (
	MaxModelLabels     = 256
	MaxLabelValueBytes = 256
	OtherModel         = "other"
)

// model returns name as a label value, or OtherModel once the bound is
// reached or when name is too long for one.
func (m *Metrics) model(name string) string {
	if len(name) > MaxLabelValueBytes || !utf8.ValidString(name) {
		return OtherModel
	}
	m.modelMu.Lock()
	defer m.modelMu.Unlock()
	if _, ok := m.models[name]; ok {
		return name
	}
	if len(m.models) >= MaxModelLabels {
		return OtherModel
	}
	m.models[name] = struct{}{}
	return name
}

type pluginKey struct {
	point string
	tn    scheduling.TypedName
}

// Bucket layouts.
var (
	// latencyBuckets cover time to first token and whole requests.
	latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	// tokenLatencyBuckets cover per-token latencies.
	tokenLatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1}
	// schedulerBuckets start at 100 µs as GIE's do, with finer steps below
	// since kvgate's decisions take tens of microseconds.
	schedulerBuckets = []float64{0.00001, 0.000025, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1}
	tokenBuckets     = prometheus.ExponentialBuckets(16, 2, 16)
	ratioBuckets     = prometheus.LinearBuckets(0, 0.1, 11)
	// errorBuckets are symmetric: a prediction can miss either way.
	errorBuckets = []float64{-8192, -2048, -512, -128, -32, -1, 0, 1, 32, 128, 512, 2048, 8192}
)

var modelLabels = []string{"model_name", "target_model_name"}

// New creates and registers the metrics on reg.
func New(reg prometheus.Registerer) *Metrics {
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		reg.MustRegister(h)
		return h
	}
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_total", Help: "Requests received, by model and priority.",
		}, append(modelLabels, "priority")),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_error_total", Help: "Requests answered with an error by the picker, by error code.",
		}, append(modelLabels, "error_code")),
		pluginObservers: map[pluginKey][]prometheus.Observer{},
		models:          map[string]struct{}{},
	}
	reg.MustRegister(m.requests, m.errors)
	m.ttft = []*prometheus.HistogramVec{
		hist("inference_objective_request_ttft_seconds", "Time to first token measured on the response stream.", latencyBuckets, modelLabels...),
		hist("llm_d_epp_request_ttft_seconds", "Time to first token measured on the response stream.", latencyBuckets, modelLabels...),
	}
	m.tpot = []*prometheus.HistogramVec{
		hist("inference_objective_request_tpot_seconds", "Time per output token after the first, measured on streamed responses.", tokenLatencyBuckets, modelLabels...),
		hist("llm_d_epp_request_streaming_tpot_seconds", "Time per output token after the first, measured on streamed responses.", tokenLatencyBuckets, modelLabels...),
	}
	m.itl = hist("llm_d_epp_request_streaming_itl_seconds", "Gap between consecutive response chunks of streaming requests.", tokenLatencyBuckets, modelLabels...)
	m.inputTokens = hist("inference_objective_input_tokens", "Prompt tokens per request as reported by the model server.", tokenBuckets, modelLabels...)
	m.outputTokens = hist("inference_objective_output_tokens", "Completion tokens per request as reported by the model server.", tokenBuckets, modelLabels...)
	m.cachedTokens = []*prometheus.HistogramVec{
		hist("inference_objective_prompt_cached_tokens", "Prompt tokens served from the prefix cache, as reported by the model server.", tokenBuckets, modelLabels...),
		hist("llm_d_epp_request_cached_tokens", "Prompt tokens served from the prefix cache, as reported by the model server.", tokenBuckets, modelLabels...),
	}
	for _, name := range []string{"inference_extension_scheduler_e2e_duration_seconds", "llm_d_epp_scheduler_e2e_duration_seconds"} {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: "Time to schedule one request, all profiles.", Buckets: schedulerBuckets})
		reg.MustRegister(h)
		m.schedulerE2E = append(m.schedulerE2E, h)
	}
	pluginLabels := []string{"extension_point", "plugin_type", "plugin_name"}
	m.pluginLatency = []*prometheus.HistogramVec{
		hist("inference_extension_plugin_duration_seconds", "Time spent in one plugin call.", schedulerBuckets, pluginLabels...),
		hist("llm_d_epp_plugin_duration_seconds", "Time spent in one plugin call.", schedulerBuckets, pluginLabels...),
	}
	m.prefixHit = []*prometheus.HistogramVec{
		hist("inference_extension_prefix_indexer_hit_ratio", "Share of a routed prompt the prefix plugin expected the chosen endpoint to have cached.", ratioBuckets, "plugin_type"),
		hist("llm_d_epp_prefix_indexer_hit_ratio", "Share of a routed prompt the prefix plugin expected the chosen endpoint to have cached.", ratioBuckets, "plugin_type"),
	}
	m.predicted = hist("kvgate_prefix_predicted_cached_tokens", "Prompt tokens the prefix plugin expected the chosen endpoint to serve from cache.", tokenBuckets, "plugin_type")
	m.predictionErr = hist("kvgate_prefix_prediction_error_tokens", "Cached tokens the server reported minus those the prefix plugin predicted.", errorBuckets, "plugin_type")
	m.predTTFT = hist("llm_d_epp_request_predicted_ttft_seconds", "Predicted time to first token of each routed request on its chosen endpoint.", latencyBuckets, modelLabels...)
	m.predTPOT = hist("llm_d_epp_request_predicted_tpot_seconds", "Predicted time per output token of each routed request on its chosen endpoint.", tokenLatencyBuckets, modelLabels...)
	m.latencyErr = hist("kvgate_latency_prediction_error_ratio", "(predicted - actual) / actual of the latency predictor, by latency type (ttft, tpot).", relativeErrorBuckets, "type")
	return m
}

// relativeErrorBuckets span under- and over-prediction by up to 4x.
var relativeErrorBuckets = []float64{-0.75, -0.5, -0.25, -0.1, -0.05, 0, 0.05, 0.1, 0.25, 0.5, 1, 2, 4}

// Predicted implements latency.Recorder.
func (m *Metrics) Predicted(_, model string, e latency.Estimate) {
	if m == nil {
		return
	}
	mn := m.model(model)
	m.predTTFT.WithLabelValues(mn, mn).Observe(e.TTFT.Seconds())
	if e.TPOT > 0 {
		m.predTPOT.WithLabelValues(mn, mn).Observe(e.TPOT.Seconds())
	}
}

// ObservedTTFT implements latency.Recorder.
func (m *Metrics) ObservedTTFT(_, _ string, predicted, actual time.Duration) {
	m.observedLatency("ttft", predicted, actual)
}

// ObservedTPOT implements latency.Recorder.
func (m *Metrics) ObservedTPOT(_, _ string, predicted, actual time.Duration) {
	m.observedLatency("tpot", predicted, actual)
}

func (m *Metrics) observedLatency(kind string, predicted, actual time.Duration) {
	if m == nil || actual <= 0 || predicted <= 0 {
		return
	}
	m.latencyErr.WithLabelValues(kind).Observe((predicted - actual).Seconds() / actual.Seconds())
}

// PrefixPredicted implements scheduling.PrefixRecorder.
// The picker hands Metrics to the prefix scorers as an untyped handle
// service; this keeps a signature change from silently disabling the
// prediction metrics.
var _ prefixmatch.Recorder = (*Metrics)(nil)

// PrefixPredicted implements prefixmatch.Recorder.
func (m *Metrics) PrefixPredicted(plugin scheduling.TypedName, predicted, prompt int) {
	if m == nil {
		return
	}
	if prompt > 0 {
		for _, h := range m.prefixHit {
			h.WithLabelValues(plugin.Type).Observe(float64(predicted) / float64(prompt))
		}
	}
	m.predicted.WithLabelValues(plugin.Type).Observe(float64(predicted))
}

// PrefixActual implements prefixmatch.Recorder.
func (m *Metrics) PrefixActual(plugin scheduling.TypedName, predicted, actual int) {
	if m == nil {
		return
	}
	m.predictionErr.WithLabelValues(plugin.Type).Observe(float64(actual - predicted))
}

// RequestReceived counts a request.
func (m *Metrics) RequestReceived(model, target string, priority int) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(m.model(model), m.model(target), strconv.Itoa(priority)).Inc()
}

// RequestError counts a request the picker answered with an error.
func (m *Metrics) RequestError(model, target, code string) {
	if m == nil {
		return
	}
	m.errors.WithLabelValues(m.model(model), m.model(target), code).Inc()
}

// SchedulerDuration records one scheduling decision.
func (m *Metrics) SchedulerDuration(d time.Duration) {
	if m == nil {
		return
	}
	for _, h := range m.schedulerE2E {
		h.Observe(d.Seconds())
	}
}

// PluginDuration records one plugin call; it has the scheduling.Observer
// signature.
func (m *Metrics) PluginDuration(point string, tn scheduling.TypedName, d time.Duration) {
	if m == nil {
		return
	}
	k := pluginKey{point, tn}
	m.mu.RLock()
	obs, ok := m.pluginObservers[k]
	m.mu.RUnlock()
	if !ok {
		for _, h := range m.pluginLatency {
			obs = append(obs, h.WithLabelValues(point, tn.Type, tn.Name))
		}
		m.mu.Lock()
		m.pluginObservers[k] = obs
		m.mu.Unlock()
	}
	for _, o := range obs {
		o.Observe(d.Seconds())
	}
}

// TTFT records a time to first token.
func (m *Metrics) TTFT(model, target string, d time.Duration) {
	if m == nil {
		return
	}
	for _, h := range m.ttft {
		h.WithLabelValues(m.model(model), m.model(target)).Observe(d.Seconds())
	}
}

// TPOT records the mean time per output token after the first, measured on
// a streamed response.
func (m *Metrics) TPOT(model, target string, d time.Duration) {
	if m == nil {
		return
	}
	for _, h := range m.tpot {
		h.WithLabelValues(m.model(model), m.model(target)).Observe(d.Seconds())
	}
}

// ITL records the gap between two response chunks of a streaming request.
func (m *Metrics) ITL(model, target string, d time.Duration) {
	if m == nil {
		return
	}
	m.itl.WithLabelValues(m.model(model), m.model(target)).Observe(d.Seconds())
}

// Usage records the token counts a response reported.
func (m *Metrics) Usage(model, target string, u openai.Usage) {
	if m == nil {
		return
	}
	model, target = m.model(model), m.model(target)
	m.inputTokens.WithLabelValues(model, target).Observe(float64(u.PromptTokens))
	m.outputTokens.WithLabelValues(model, target).Observe(float64(u.CompletionTokens))
	for _, h := range m.cachedTokens {
		h.WithLabelValues(model, target).Observe(float64(u.CachedTokens))
	}
}
