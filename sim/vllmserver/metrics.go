package vllmserver

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/vllm"
	"github.com/kvgate/kvgate/sim/engine"
)

// vLLM's histogram buckets (vllm/v1/metrics/loggers.py), so that dashboards
// and quantiles built for vLLM read the same here.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	// e2eBuckets also bound the per-phase request times, as in vLLM.
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
		60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	prefillTokenBuckets = []float64{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0}
	paramsNBuckets      = []float64{1, 2, 5, 10, 20}
)

// buckets125 are vLLM's 1-2-5 buckets up to limit (build_1_2_5_buckets):
// 1, 2, 5, 10, 20, 50, ... while at most limit.
func buckets125(limit int) []float64 {
	var out []float64
	for scale := 1; ; scale *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*scale > limit {
				return out
			}
			out = append(out, float64(m*scale))
		}
	}
}

// serverMetrics are the latency histograms and request counters the
// handlers observe; everything else is read from the engine at scrape time.
type serverMetrics struct {
	ttft, itl, tpotOld, reqTPOT, e2e              prometheus.Histogram
	queue, prefill, decode, inference, perPrefill prometheus.Histogram
	promptLen, genLen, maxGen, maxTokens, paramN  prometheus.Histogram
	success                                       *prometheus.CounterVec
}

func newServerMetrics(reg prometheus.Registerer, model string, r *engine.Runner, cfg engine.Config) (*serverMetrics, error) {
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
	}
	lengths := buckets125(cfg.MaxModelLen)
	m := &serverMetrics{
		ttft:       hist(vllm.MetricTimeToFirstTokenSeconds, "Time to first token in seconds (simulated).", ttftBuckets),
		itl:        hist(vllm.MetricInterTokenLatencySeconds, "Inter-token latency in seconds (simulated).", itlBuckets),
		tpotOld:    hist(vllm.MetricTimePerOutputTokenSeconds, "Time per output token in seconds (simulated; deprecated: use vllm:inter_token_latency_seconds).", itlBuckets),
		reqTPOT:    hist(vllm.MetricRequestTimePerOutputTokenSeconds, "Time per output token of each request in seconds (simulated).", itlBuckets),
		e2e:        hist(vllm.MetricE2ERequestLatencySeconds, "End-to-end request latency in seconds (simulated).", e2eBuckets),
		queue:      hist(vllm.MetricRequestQueueTimeSeconds, "Time spent in WAITING phase for request (simulated).", e2eBuckets),
		prefill:    hist(vllm.MetricRequestPrefillTimeSeconds, "Time spent in PREFILL phase for request (simulated).", e2eBuckets),
		decode:     hist(vllm.MetricRequestDecodeTimeSeconds, "Time spent in DECODE phase for request (simulated).", e2eBuckets),
		inference:  hist(vllm.MetricRequestInferenceTimeSeconds, "Time spent in RUNNING phase for request (simulated).", e2eBuckets),
		perPrefill: hist(vllm.MetricTimePerPrefillTokenSeconds, "Time spent per token during prefill phase in seconds (simulated).", prefillTokenBuckets),
		promptLen:  hist(vllm.MetricRequestPromptTokens, "Number of prefill tokens processed.", lengths),
		genLen:     hist(vllm.MetricRequestGenerationTokens, "Number of generation tokens processed.", lengths),
		maxGen:     hist(vllm.MetricRequestMaxNumGenerationTokens, "Histogram of maximum number of requested generation tokens.", lengths),
		maxTokens:  hist(vllm.MetricRequestParamsMaxTokens, "Histogram of the max_tokens request parameter.", lengths),
		paramN:     hist(vllm.MetricRequestParamsN, "Histogram of the n request parameter.", paramsNBuckets),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{Name: vllm.MetricRequestSuccessTotal,
			Help: "Count of successfully processed requests.", ConstLabels: labels}, []string{"finished_reason"}),
	}
	for _, c := range []prometheus.Collector{m.ttft, m.itl, m.tpotOld, m.reqTPOT, m.e2e, m.queue, m.prefill, m.decode,
		m.inference, m.perPrefill, m.promptLen, m.genLen, m.maxGen, m.maxTokens, m.paramN, m.success,
		newEngineCollector(r, cfg, labels)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// recorder observes one request's latencies on the engine's clock.
type recorder struct {
	m         *serverMetrics
	arrival   time.Time
	first     time.Time
	last      time.Time
	n         int
	maxTokens int
}

// newRecorder starts recording a request that arrived at arrival and asked
// for maxTokens (0: it did not say).
func (m *serverMetrics) newRecorder(arrival time.Time, maxTokens int) *recorder {
	return &recorder{m: m, arrival: arrival, maxTokens: maxTokens}
}

// tokens records k tokens read at now. Tokens read together (a reader that
// fell behind) share the gap since the previous read.
func (r *recorder) tokens(now time.Time, k int) {
	if r.n == 0 {
		r.m.ttft.Observe(now.Sub(r.arrival).Seconds())
		r.n, r.first, r.last, k = 1, now, now, k-1
	}
	if k > 0 {
		gap := now.Sub(r.last).Seconds() / float64(k)
		for range k {
			r.m.itl.Observe(gap)
			r.m.tpotOld.Observe(gap)
		}
		r.n += k
	}
	r.last = now
}

// finish records a finished request: vLLM's per-request histograms, its
// phases measured from when the engine first scheduled it.
func (r *recorder) finish(now time.Time, reason string, fin *engine.Finished) {
	m := r.m
	m.e2e.Observe(now.Sub(r.arrival).Seconds())
	m.success.WithLabelValues(reason).Inc()
	u := fin.Usage
	m.promptLen.Observe(float64(u.PromptTokens))
	m.genLen.Observe(float64(u.CompletionTokens))
	// n is always 1: the request's own output is the group's longest.
	m.maxGen.Observe(float64(u.CompletionTokens))
	m.paramN.Observe(1)
	if r.maxTokens > 0 {
		m.maxTokens.Observe(float64(r.maxTokens))
	}
	if fin.Scheduled.IsZero() || r.n == 0 {
		return
	}
	m.queue.Observe(fin.Scheduled.Sub(r.arrival).Seconds())
	prefill := r.first.Sub(fin.Scheduled).Seconds()
	m.prefill.Observe(prefill)
	if u.PromptTokens > 0 {
		m.perPrefill.Observe(prefill / float64(u.PromptTokens))
	}
	m.decode.Observe(r.last.Sub(r.first).Seconds())
	m.inference.Observe(r.last.Sub(fin.Scheduled).Seconds())
	if r.n > 1 {
		m.reqTPOT.Observe(r.last.Sub(r.first).Seconds() / float64(r.n-1))
	}
}

// engineCollector exports the engine's state and counters under vLLM's
// names, from one snapshot per scrape.
type engineCollector struct {
	r           *engine.Runner
	maxLoRAs    int
	running     *prometheus.Desc
	waiting     *prometheus.Desc
	kvUsage     *prometheus.Desc
	queries     *prometheus.Desc
	hits        *prometheus.Desc
	prompt      *prometheus.Desc
	generation  *prometheus.Desc
	preemptions *prometheus.Desc
	lora        *prometheus.Desc
	iteration   *prometheus.Desc
	cacheConfig prometheus.Metric
}

func newEngineCollector(r *engine.Runner, cfg engine.Config, labels prometheus.Labels) *engineCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, labels) }
	// cache_config_info carries the configuration in its labels, values
	// spelled as Python prints them.
	cacheLabels := prometheus.Labels{
		"engine":                   "0",
		vllm.LabelBlockSize:        strconv.Itoa(cfg.BlockSize),
		vllm.LabelNumGPUBlocks:     strconv.Itoa(cfg.NumGPUBlocks),
		"gpu_memory_utilization":   strconv.FormatFloat(cfg.GPUMemoryUtilization, 'f', -1, 64),
		"cache_dtype":              "auto",
		"enable_prefix_caching":    "True",
		"prefix_caching_hash_algo": "sha256_cbor",
	}
	return &engineCollector{
		r: r, maxLoRAs: cfg.MaxLoRAs,
		running:     d(vllm.MetricNumRequestsRunning, "Number of requests in model execution batches."),
		waiting:     d(vllm.MetricNumRequestsWaiting, "Number of requests waiting to be processed."),
		kvUsage:     d(vllm.MetricKVCacheUsagePerc, "KV-cache usage. 1 means 100 percent usage."),
		queries:     d(vllm.MetricPrefixCacheQueriesTotal, "Prefix cache queries, in terms of number of queried tokens."),
		hits:        d(vllm.MetricPrefixCacheHitsTotal, "Prefix cache hits, in terms of number of cached tokens."),
		prompt:      d(vllm.MetricPromptTokensTotal, "Number of prefill tokens processed."),
		generation:  d(vllm.MetricGenerationTokensTotal, "Number of generation tokens processed."),
		preemptions: d(vllm.MetricNumPreemptionsTotal, "Cumulative number of preemptions from the engine."),
		iteration:   d(vllm.MetricIterationTokensTotal, "Histogram of number of tokens per engine_step."),
		lora: prometheus.NewDesc(vllm.MetricLoRARequestsInfo, "Running stats on LoRA requests.",
			[]string{vllm.LabelMaxLoRA, vllm.LabelRunningLoRAAdapters, vllm.LabelWaitingLoRAAdapters}, nil),
		cacheConfig: prometheus.MustNewConstMetric(
			prometheus.NewDesc(vllm.MetricCacheConfigInfo, "Information of the LLMEngine CacheConfig.", nil, cacheLabels),
			prometheus.GaugeValue, 1),
	}
}

// Describe implements prometheus.Collector.
func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.kvUsage, c.queries, c.hits, c.prompt,
		c.generation, c.preemptions, c.iteration, c.lora, c.cacheConfig.Desc()} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.r.Metrics()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(c.running, float64(m.Running))
	gauge(c.waiting, float64(m.Waiting))
	gauge(c.kvUsage, m.KVUsage)
	counter(c.queries, m.PrefixCacheQueries)
	counter(c.hits, m.PrefixCacheHits)
	counter(c.prompt, m.PromptTokens)
	counter(c.generation, m.GenerationTokens)
	counter(c.preemptions, m.Preemptions)
	it := m.IterationTokens
	ch <- prometheus.MustNewConstHistogram(c.iteration, it.Count, it.Sum, it.Buckets)
	if c.maxLoRAs > 0 {
		// vLLM sets the value to the time of the snapshot; readers keep the
		// newest series.
		ch <- prometheus.MustNewConstMetric(c.lora, prometheus.GaugeValue, float64(time.Now().UnixNano())/1e9,
			strconv.Itoa(c.maxLoRAs), strings.Join(m.RunningLoRAs, ","), strings.Join(m.WaitingLoRAs, ","))
	}
	ch <- c.cacheConfig
}
