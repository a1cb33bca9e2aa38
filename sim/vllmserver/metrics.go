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
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
		60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// serverMetrics are the latency histograms and request counters the
// handlers observe; everything else is read from the engine at scrape time.
type serverMetrics struct {
	ttft, itl, e2e prometheus.Histogram
	success        *prometheus.CounterVec
}

func newServerMetrics(reg prometheus.Registerer, model string, r *engine.Runner, cfg engine.Config) (*serverMetrics, error) {
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
	}
	m := &serverMetrics{
		ttft: hist(vllm.MetricTimeToFirstTokenSeconds, "Time to first token in seconds (simulated).", ttftBuckets),
		itl:  hist(vllm.MetricInterTokenLatencySeconds, "Inter-token latency in seconds (simulated).", itlBuckets),
		e2e:  hist(vllm.MetricE2ERequestLatencySeconds, "End-to-end request latency in seconds (simulated).", e2eBuckets),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{Name: vllm.MetricRequestSuccessTotal,
			Help: "Count of successfully processed requests.", ConstLabels: labels}, []string{"finished_reason"}),
	}
	for _, c := range []prometheus.Collector{m.ttft, m.itl, m.e2e, m.success, newEngineCollector(r, cfg, labels)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// recorder observes one request's latencies on the engine's clock.
type recorder struct {
	m       *serverMetrics
	arrival time.Time
	last    time.Time
	n       int
}

func (m *serverMetrics) newRecorder(arrival time.Time) *recorder {
	return &recorder{m: m, arrival: arrival}
}

// tokens records k tokens read at now. Tokens read together (a reader that
// fell behind) share the gap since the previous read.
func (r *recorder) tokens(now time.Time, k int) {
	if r.n == 0 {
		r.m.ttft.Observe(now.Sub(r.arrival).Seconds())
		r.n, r.last, k = 1, now, k-1
	}
	if k > 0 {
		gap := now.Sub(r.last).Seconds() / float64(k)
		for range k {
			r.m.itl.Observe(gap)
		}
		r.n += k
	}
	r.last = now
}

func (r *recorder) finish(now time.Time, reason string) {
	r.m.e2e.Observe(now.Sub(r.arrival).Seconds())
	r.m.success.WithLabelValues(reason).Inc()
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
		c.generation, c.preemptions, c.lora, c.cacheConfig.Desc()} {
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
	if c.maxLoRAs > 0 {
		// vLLM sets the value to the time of the snapshot; readers keep the
		// newest series.
		ch <- prometheus.MustNewConstMetric(c.lora, prometheus.GaugeValue, float64(time.Now().UnixNano())/1e9,
			strconv.Itoa(c.maxLoRAs), strings.Join(m.RunningLoRAs, ","), strings.Join(m.WaitingLoRAs, ","))
	}
	ch <- c.cacheConfig
}
