// Package metrics defines the picker's request, scheduler, plugin and
// build metrics under the names users' dashboards and autoscalers read:
// llm-d's current llm_d_epp_* catalog, and the GIE-era names that llm-d
// still emits beside them (inference_objective_*, inference_extension_*),
// with upstream's labels and buckets (llm-d-router pkg/epp/metrics). Pool
// and endpoint gauges live with the endpoint datastore that owns that state
// (extproc/endpoints/poolmetrics); KV-index metrics with the index
// (extproc/kvindex.Collector).
//
// Everything registers on a Registerer the binary passes in; nothing touches
// the global Prometheus registry.
package metrics

import (
	"runtime/debug"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/metrics/seriescache"
	"github.com/kvgate/kvgate/extproc/plugins/disagg"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Labels identify a request in the request metrics.
type Labels struct {
	Model, Target string
	FairnessID    string
	Priority      int
}

// Metrics records per-request and per-decision observations. A nil
// *Metrics records nothing.
type Metrics struct {
	// GIE names: labels model_name, target_model_name (+priority on the
	// request counter, +error_code on the error counter).
	gieRequests, gieErrors                   *prometheus.CounterVec
	gieDuration, gieReqSize, gieRespSize     *prometheus.HistogramVec
	gieInput, gieOutput, gieCached, gieNTPOT *prometheus.HistogramVec
	gieRunning                               *prometheus.GaugeVec // model_name only
	// llm-d names: labels model_name, target_model_name, fairness_id,
	// priority (+error_code, +streaming).
	requests, errors               *prometheus.CounterVec
	duration, reqSize, respSize    *prometheus.HistogramVec
	input, output, cached, ntpot   *prometheus.HistogramVec
	ttftLLMD, tpotLLMD, itlLLMD    *prometheus.HistogramVec
	running                        *prometheus.GaugeVec
	reqProcessing, respProcessing  prometheus.Histogram
	schedulerE2E                   []prometheus.Histogram
	gieAttempts, attempts          *prometheus.CounterVec
	pluginLatency                  []*prometheus.HistogramVec
	gieHitRatio                    prometheus.Histogram
	hitRatio                       *prometheus.HistogramVec
	gieTTFT, gieTPOT               *prometheus.HistogramVec
	predicted, predictionErr       *prometheus.HistogramVec
	predTTFT, predTPOT, latencyErr *prometheus.HistogramVec
	held                           *prometheus.HistogramVec
	// Disaggregation decisions: llm-d's (plugin_name, plugin_type,
	// model_name, decision_type) and the deprecated
	// llm_d_inference_scheduler_* twins (model_name, decision_type).
	disagg, disaggOld, pd, pdOld *prometheus.CounterVec

	// pluginObservers caches the label lookups of plugin timings, which run
	// several times per request on the hot path. Bounded by the number of
	// configured plugins × extension points.
	mu              sync.RWMutex
	pluginObservers map[pluginKey][]prometheus.Observer

	// models and fairness bound the label values that come from clients:
	// each new value would create series for good.
	boundMu  sync.Mutex
	models   map[string]struct{}
	fairness map[string]struct{}

	// series caches each request label set's resolved series: a request
	// touches about twenty of them, and every WithLabelValues hashes its
	// labels and takes its vector's lock. Bounded by maxCachedSeries.
	series *seriescache.Cache[seriesKey, requestSeries]
}

// seriesKey is a label set after bounding (values).
type seriesKey struct{ model, target, fairness, priority string }

// maxCachedSeries bounds the series cache (see package seriescache for
// what eviction costs).
const maxCachedSeries = 4096

// requestSeries are the series one request label set writes to, each
// resolved on first use so that a series appears in /metrics only once it
// has been written, as with WithLabelValues.
type requestSeries struct {
	key                                        seriesKey
	counted                                    sync.Once
	gieRequests, requests                      prometheus.Counter
	gauged                                     sync.Once
	gieRunning, running                        prometheus.Gauge
	reqSize, respSize, duration, input, output observerPair
	ntpot, cached, tpot, itl                   observerPair
	ttft                                       [2]observerPair // by streaming: false, true
}

// observerPair is a histogram's series in GIE's family (model_name,
// target_model_name; absent where GIE has none) and in llm-d's (those and
// fairness_id, priority).
type observerPair struct {
	once      sync.Once
	gie, llmd prometheus.Observer
}

func (p *observerPair) observe(gie, llmd *prometheus.HistogramVec, k seriesKey, v float64, more ...string) {
	p.once.Do(func() {
		if gie != nil {
			p.gie = gie.WithLabelValues(k.model, k.target)
		}
		p.llmd = llmd.WithLabelValues(append([]string{k.model, k.target, k.fairness, k.priority}, more...)...)
	})
	if p.gie != nil {
		p.gie.Observe(v)
	}
	p.llmd.Observe(v)
}

// MaxModelLabels is how many distinct model names (incoming and target
// together) get their own series, and MaxFairnessLabels how many fairness
// ids, as in llm-d; later values are counted under OtherModel. Values
// longer than MaxLabelValueBytes, or not UTF-8, are counted there too: a
// thousand names of a megabyte each would make /metrics a gigabyte.
const (
	MaxModelLabels     = 1000
	MaxFairnessLabels  = 1000
	MaxLabelValueBytes = 256
	OtherModel         = "other"
)

// bound returns v as a label value, or OtherModel once set holds max
// values or when v is unfit for one.
func (m *Metrics) bound(set map[string]struct{}, max int, v string) string {
	if len(v) > MaxLabelValueBytes || !utf8.ValidString(v) {
		return OtherModel
	}
	if _, ok := set[v]; ok {
		return v
	}
	if len(set) >= max {
		return OtherModel
	}
	set[v] = struct{}{}
	return v
}

func (m *Metrics) model(name string) string {
	m.boundMu.Lock()
	defer m.boundMu.Unlock()
	return m.bound(m.models, MaxModelLabels, name)
}

// values are l's llm-d label values: model, target, fairness, priority.
func (m *Metrics) values(l Labels) (model, target, fairness, priority string) {
	m.boundMu.Lock()
	defer m.boundMu.Unlock()
	return m.bound(m.models, MaxModelLabels, l.Model), m.bound(m.models, MaxModelLabels, l.Target),
		m.bound(m.fairness, MaxFairnessLabels, l.FairnessID), strconv.Itoa(l.Priority)
}

// seriesFor returns l's series, resolving them on first use.
func (m *Metrics) seriesFor(l Labels) *requestSeries {
	model, target, fair, prio := m.values(l)
	return m.series.Get(seriesKey{model, target, fair, prio})
}

type pluginKey struct {
	point string
	tn    scheduling.TypedName
}

// Bucket layouts, upstream's (llm-d-router pkg/epp/metrics) unless noted.
var (
	// generalLatencyBuckets: 5 ms to an hour.
	generalLatencyBuckets = []float64{0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6,
		8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600}
	requestSizeBuckets = []float64{64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
		131072, 262144, 524288, 1048576, 2097152, 4194304, 8388608,
		16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824}
	// 32778 (sic) is upstream's.
	responseSizeBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536}
	inputTokenBuckets   = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144, 524288, 1048576}
	outputTokenBuckets  = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}
	ntpotBuckets        = []float64{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0}
	ttftBuckets         = []float64{0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120}
	tpotBuckets         = []float64{0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 2}
	itlBuckets          = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2}
	schedulerBuckets    = []float64{0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1}
	reqProcBuckets      = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	respProcBuckets     = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
	ratioBuckets        = []float64{0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0}

	// kvgate's own histograms.
	latencyBuckets      = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	tokenLatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1}
	tokenBuckets        = prometheus.ExponentialBuckets(16, 2, 16)
	// errorBuckets are symmetric: a prediction can miss either way.
	errorBuckets = []float64{-8192, -2048, -512, -128, -32, -1, 0, 1, 32, 128, 512, 2048, 8192}
	// relativeErrorBuckets span under- and over-prediction by up to 4x.
	relativeErrorBuckets = []float64{-0.75, -0.5, -0.25, -0.1, -0.05, 0, 0.05, 0.1, 0.25, 0.5, 1, 2, 4}
)

var (
	modelLabels      = []string{"model_name", "target_model_name"}
	requestLabels    = []string{"model_name", "target_model_name", "fairness_id", "priority"}
	pluginLabels     = []string{"extension_point", "plugin_type", "plugin_name"}
	gieAttemptLabels = []string{"status", "target_model_name", "pod_name", "namespace", "port"}
	attemptLabels    = []string{"status", "target_model_name", "endpoint_name", "namespace", "port"}
	disaggLabels     = []string{"plugin_name", "plugin_type", "model_name", "decision_type"}
)

func with(labels []string, more ...string) []string {
	return append(append([]string{}, labels...), more...)
}

// New creates and registers the metrics on reg.
func New(reg prometheus.Registerer) *Metrics {
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		reg.MustRegister(h)
		return h
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
		reg.MustRegister(g)
		return g
	}
	plain := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
		reg.MustRegister(h)
		return h
	}
	m := &Metrics{
		pluginObservers: map[pluginKey][]prometheus.Observer{},
		models:          map[string]struct{}{},
		fairness:        map[string]struct{}{},
		series:          seriescache.New(maxCachedSeries, func(k seriesKey) *requestSeries { return &requestSeries{key: k} }),
	}

	m.gieRequests = counter("inference_objective_request_total", "[Deprecated: use llm_d_epp_request_total] Requests received, by model and priority.", with(modelLabels, "priority")...)
	m.gieErrors = counter("inference_objective_request_error_total", "[Deprecated: use llm_d_epp_request_error_total] Request errors, by error code.", with(modelLabels, "error_code")...)
	m.gieDuration = hist("inference_objective_request_duration_seconds", "[Deprecated: use llm_d_epp_request_duration_seconds] Request latency, from its arrival at the picker to the end of the response.", generalLatencyBuckets, modelLabels...)
	m.gieReqSize = hist("inference_objective_request_sizes", "[Deprecated: use llm_d_epp_request_size_bytes] Request body size in bytes.", requestSizeBuckets, modelLabels...)
	m.gieRespSize = hist("inference_objective_response_sizes", "[Deprecated: use llm_d_epp_response_size_bytes] Response body size in bytes.", responseSizeBuckets, modelLabels...)
	m.gieInput = hist("inference_objective_input_tokens", "[Deprecated: use llm_d_epp_request_input_tokens] Prompt tokens per request as reported by the model server.", inputTokenBuckets, modelLabels...)
	m.gieOutput = hist("inference_objective_output_tokens", "[Deprecated: use llm_d_epp_request_output_tokens] Completion tokens per request as reported by the model server.", outputTokenBuckets, modelLabels...)
	m.gieCached = hist("inference_objective_prompt_cached_tokens", "[Deprecated: use llm_d_epp_request_cached_tokens] Prompt tokens served from the prefix cache, as reported by the model server.", inputTokenBuckets, modelLabels...)
	m.gieRunning = gauge("inference_objective_running_requests", "[Deprecated: use llm_d_epp_request_running] Requests routed whose response has not ended.", "model_name")
	m.gieNTPOT = hist("inference_objective_normalized_time_per_output_token_seconds", "[Deprecated: use llm_d_epp_request_ntpot_seconds] Request latency divided by its output tokens.", ntpotBuckets, modelLabels...)

	m.requests = counter("llm_d_epp_request_total", "Total number of processed requests.", requestLabels...)
	m.errors = counter("llm_d_epp_request_error_total", "Total number of request errors.", with(requestLabels, "error_code")...)
	m.duration = hist("llm_d_epp_request_duration_seconds", "End-to-end request latency distribution in seconds.", generalLatencyBuckets, requestLabels...)
	m.reqSize = hist("llm_d_epp_request_size_bytes", "Incoming request body size distribution in bytes.", requestSizeBuckets, requestLabels...)
	m.respSize = hist("llm_d_epp_response_size_bytes", "Outgoing response body size distribution in bytes.", responseSizeBuckets, requestLabels...)
	m.input = hist("llm_d_epp_request_input_tokens", "Input token count distribution per request.", inputTokenBuckets, requestLabels...)
	m.output = hist("llm_d_epp_request_output_tokens", "Output token count distribution per request.", outputTokenBuckets, requestLabels...)
	m.cached = hist("llm_d_epp_request_cached_tokens", "Prompt tokens read from cache per request, as reported by the model server.", inputTokenBuckets, requestLabels...)
	m.running = gauge("llm_d_epp_request_running", "Current number of active running requests.", requestLabels...)
	m.ntpot = hist("llm_d_epp_request_ntpot_seconds", "Normalized time per output token in seconds (end-to-end latency divided by output token count).", ntpotBuckets, requestLabels...)
	m.ttftLLMD = hist("llm_d_epp_request_ttft_seconds", "Time to first token in seconds, from request received to the first response byte; for non-streaming requests, the whole request.", ttftBuckets, with(requestLabels, "streaming")...)
	m.tpotLLMD = hist("llm_d_epp_request_streaming_tpot_seconds", "Average time per output token of streaming requests, (e2e - TTFT) / (output_tokens - 1).", tpotBuckets, requestLabels...)
	m.itlLLMD = hist("llm_d_epp_request_streaming_itl_seconds", "Time between consecutive response body chunks of streaming requests.", itlBuckets, requestLabels...)
	m.reqProcessing = plain("llm_d_epp_request_processing_duration_seconds", "Picker time from a request's arrival until its body was handled (the routing decision sent).", reqProcBuckets)
	m.respProcessing = plain("llm_d_epp_response_processing_duration_seconds", "Picker time spent handling a response: the sum of its per-chunk handling.", respProcBuckets)

	for _, name := range []string{"inference_extension_scheduler_e2e_duration_seconds", "llm_d_epp_scheduler_e2e_duration_seconds"} {
		m.schedulerE2E = append(m.schedulerE2E, plain(name, "End-to-end scheduling latency distribution in seconds.", schedulerBuckets))
	}
	m.gieAttempts = counter("inference_extension_scheduler_attempts_total", "[Deprecated: use llm_d_epp_scheduler_attempts_total] Total number of scheduling attempts.", gieAttemptLabels...)
	m.attempts = counter("llm_d_epp_scheduler_attempts_total", "Total number of scheduling attempts.", attemptLabels...)
	m.pluginLatency = []*prometheus.HistogramVec{
		hist("inference_extension_plugin_duration_seconds", "[Deprecated: use llm_d_epp_plugin_duration_seconds] Plugin processing latency in seconds.", schedulerBuckets, pluginLabels...),
		hist("llm_d_epp_plugin_duration_seconds", "Plugin processing latency distribution in seconds for each extension point, plugin type and plugin name.", schedulerBuckets, pluginLabels...),
	}
	m.gieHitRatio = plain("inference_extension_prefix_indexer_hit_ratio", "[Deprecated: use llm_d_epp_prefix_indexer_hit_ratio] Share of a routed prompt the prefix plugin expected the chosen endpoint to have cached.", ratioBuckets)
	m.hitRatio = hist("llm_d_epp_prefix_indexer_hit_ratio", "Share of a routed prompt the prefix plugin expected the chosen endpoint to have cached.", ratioBuckets, "plugin_name", "plugin_type")

	commit, ref := buildInfo()
	for _, name := range []string{"inference_extension_info", "llm_d_epp_info"} {
		g := gauge(name, "General information of the current build of the endpoint picker.", "commit", "build_ref")
		g.WithLabelValues(commit, ref).Set(1)
	}

	m.gieTTFT = hist("inference_objective_request_ttft_seconds", "Time to first token measured on the response stream.", latencyBuckets, modelLabels...)
	m.gieTPOT = hist("inference_objective_request_tpot_seconds", "Time per output token after the first, measured on streamed responses.", tokenLatencyBuckets, modelLabels...)
	m.predicted = hist("kvgate_prefix_predicted_cached_tokens", "Prompt tokens the prefix plugin expected the chosen endpoint to serve from cache.", tokenBuckets, "plugin_type")
	m.predictionErr = hist("kvgate_prefix_prediction_error_tokens", "Cached tokens the server reported minus those the prefix plugin predicted.", errorBuckets, "plugin_type")
	m.predTTFT = hist("llm_d_epp_request_predicted_ttft_seconds", "Predicted time to first token of each routed request on its chosen endpoint.", latencyBuckets, modelLabels...)
	m.predTPOT = hist("llm_d_epp_request_predicted_tpot_seconds", "Predicted time per output token of each routed request on its chosen endpoint.", tokenLatencyBuckets, modelLabels...)
	m.disagg = counter("llm_d_epp_disagg_decision_total", "Total number of disaggregation routing decisions made.", disaggLabels...)
	m.disaggOld = counter("llm_d_inference_scheduler_disagg_decision_total", "[Deprecated: use llm_d_epp_disagg_decision_total] Total number of disaggregation routing decisions made.", "model_name", "decision_type")
	m.pd = counter("llm_d_epp_pd_decision_total", "Total number of P/D disaggregation decisions made.", disaggLabels...)
	m.pdOld = counter("llm_d_inference_scheduler_pd_decision_total", "[Deprecated: use llm_d_epp_pd_decision_total] Total number of P/D disaggregation decisions made.", "model_name", "decision_type")
	m.latencyErr = hist("kvgate_latency_prediction_error_ratio", "(predicted - actual) / actual of the latency predictor, by latency type (ttft, tpot).", relativeErrorBuckets, "type")
	m.held = hist("kvgate_prefill_join_hold_seconds", "Time a routed request waited in the picker (prefill-join-hold) before it was sent, by how the wait ended (released, bound, cancelled).", latencyBuckets, "outcome")
	return m
}

// buildInfo is the info metrics' commit and build_ref: the VCS revision
// and the module version the binary was built from.
func buildInfo() (commit, ref string) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			commit = s.Value
		}
	}
	return commit, bi.Main.Version
}

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
		r := float64(predicted) / float64(prompt)
		m.gieHitRatio.Observe(r)
		m.hitRatio.WithLabelValues(plugin.Name, plugin.Type).Observe(r)
	}
	m.predicted.WithLabelValues(plugin.Type).Observe(float64(predicted))
}

// The disaggregation handlers find Metrics as an untyped handle service
// too.
var _ disagg.Recorder = (*Metrics)(nil)

// DisaggDecision implements disagg.Recorder: an empty model counts as
// "unknown", as in llm-d.
func (m *Metrics) DisaggDecision(plugin scheduling.TypedName, model, decision string) {
	m.decision(m.disagg, m.disaggOld, plugin, model, decision)
}

// PDDecision implements disagg.Recorder.
func (m *Metrics) PDDecision(plugin scheduling.TypedName, model, decision string) {
	m.decision(m.pd, m.pdOld, plugin, model, decision)
}

func (m *Metrics) decision(now, old *prometheus.CounterVec, plugin scheduling.TypedName, model, decision string) {
	if m == nil {
		return
	}
	if model == "" {
		model = "unknown"
	}
	model = m.model(model)
	now.WithLabelValues(plugin.Name, plugin.Type, model, decision).Inc()
	old.WithLabelValues(model, decision).Inc()
}

// PrefixActual implements prefixmatch.Recorder.
func (m *Metrics) PrefixActual(plugin scheduling.TypedName, predicted, actual int) {
	if m == nil {
		return
	}
	m.predictionErr.WithLabelValues(plugin.Type).Observe(float64(actual - predicted))
}

// RequestReceived counts a routed request (llm-d counts a request once the
// picker has decided where it goes; refusals count as errors only); size is
// its body's length in bytes, or negative when unknown (a headers-only
// request without content-length).
func (m *Metrics) RequestReceived(l Labels, size int) {
	if m == nil {
		return
	}
	s := m.seriesFor(l)
	k := s.key
	s.counted.Do(func() {
		s.gieRequests = m.gieRequests.WithLabelValues(k.model, k.target, k.priority)
		s.requests = m.requests.WithLabelValues(k.model, k.target, k.fairness, k.priority)
	})
	s.gieRequests.Inc()
	s.requests.Inc()
	if size >= 0 {
		s.reqSize.observe(m.gieReqSize, m.reqSize, k, float64(size))
	}
}

// RequestError counts a request that ended in an error: one the picker
// answered, or a model server's non-200 answer (inferr.ModelServerError).
func (m *Metrics) RequestError(l Labels, code string) {
	if m == nil || code == "" {
		return
	}
	model, target, fair, prio := m.values(l)
	m.gieErrors.WithLabelValues(model, target, code).Inc()
	m.errors.WithLabelValues(model, target, fair, prio, code).Inc()
}

// Running adds delta (+1 when a request is routed, -1 when its response
// ends) to the running-requests gauges.
func (m *Metrics) Running(l Labels, delta int) {
	if m == nil || l.Model == "" {
		return
	}
	s := m.seriesFor(l)
	s.gauged.Do(func() {
		k := s.key
		s.gieRunning = m.gieRunning.WithLabelValues(k.model)
		s.running = m.running.WithLabelValues(k.model, k.target, k.fairness, k.priority)
	})
	s.gieRunning.Add(float64(delta))
	s.running.Add(float64(delta))
}

// RequestProcessing records the picker's time on a request up to its
// decision.
func (m *Metrics) RequestProcessing(d time.Duration) {
	if m == nil {
		return
	}
	m.reqProcessing.Observe(d.Seconds())
}

// Hold outcomes of Held.
const (
	HoldReleased  = "released"
	HoldBound     = "bound"
	HoldCancelled = "cancelled"
)

// Held records a request a Holder kept in the picker for d, and how the
// wait ended.
func (m *Metrics) Held(outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.held.WithLabelValues(outcome).Observe(d.Seconds())
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

// Scheduler attempt outcomes, the status label.
const (
	AttemptSuccess = "success"
	AttemptFailure = "failure"
)

// SchedulerAttempt counts one scheduling attempt and, on success, the
// primary endpoint chosen (name, namespace, port; empty on failure).
func (m *Metrics) SchedulerAttempt(status, target, endpoint, namespace, port string) {
	if m == nil {
		return
	}
	target = m.model(target)
	m.gieAttempts.WithLabelValues(status, target, endpoint, namespace, port).Inc()
	m.attempts.WithLabelValues(status, target, endpoint, namespace, port).Inc()
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

// TTFT records a time to first token as the first response chunk passes.
func (m *Metrics) TTFT(model, target string, d time.Duration) {
	if m == nil {
		return
	}
	m.gieTTFT.WithLabelValues(m.model(model), m.model(target)).Observe(d.Seconds())
}

// ITL records the gap between two response chunks of a streaming request.
func (m *Metrics) ITL(l Labels, d time.Duration) {
	if m == nil {
		return
	}
	s := m.seriesFor(l)
	s.itl.observe(nil, m.itlLLMD, s.key, d.Seconds())
}

// Response is what the picker saw of a response that ended.
type Response struct {
	Received, FirstChunk, Done time.Time // FirstChunk zero without a body
	Streaming                  bool
	Bytes                      int
	// Usage is the token counts the response reported; UsageFound false
	// when it reported none.
	Usage      openai.Usage
	UsageFound bool
	// Processing is the picker's own time spent on the response.
	Processing time.Duration
}

// ResponseComplete records a response seen to its end: latency, size,
// TTFT, time per output token and token counts.
func (m *Metrics) ResponseComplete(l Labels, r Response) {
	if m == nil {
		return
	}
	s := m.seriesFor(l)
	k := s.key
	m.respProcessing.Observe(r.Processing.Seconds())
	s.respSize.observe(m.gieRespSize, m.respSize, k, float64(r.Bytes))
	if !r.Done.After(r.Received) {
		return
	}
	e2e := r.Done.Sub(r.Received).Seconds()
	s.duration.observe(m.gieDuration, m.duration, k, e2e)
	if r.FirstChunk.After(r.Received) {
		streaming := 0
		if r.Streaming {
			streaming = 1
		}
		s.ttft[streaming].observe(nil, m.ttftLLMD, k, r.FirstChunk.Sub(r.Received).Seconds(), strconv.FormatBool(r.Streaming))
	}
	if !r.UsageFound {
		return
	}
	u := r.Usage
	if u.PromptTokens > 0 {
		s.input.observe(m.gieInput, m.input, k, float64(u.PromptTokens))
	}
	if u.CompletionTokens > 0 {
		s.output.observe(m.gieOutput, m.output, k, float64(u.CompletionTokens))
		s.ntpot.observe(m.gieNTPOT, m.ntpot, k, e2e/float64(u.CompletionTokens))
	}
	s.cached.observe(m.gieCached, m.cached, k, float64(u.CachedTokens))
	if r.Streaming && u.CompletionTokens > 1 && r.FirstChunk.After(r.Received) && r.Done.After(r.FirstChunk) {
		tpot := r.Done.Sub(r.FirstChunk) / time.Duration(u.CompletionTokens-1)
		s.tpot.observe(m.gieTPOT, m.tpotLLMD, k, tpot.Seconds())
	}
}
