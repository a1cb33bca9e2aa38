package poolmetrics

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

var (
	poolLabels     = []string{"name"}
	endpointLabels = []string{"name", "endpoint"}
	inflightLabels = []string{"endpoint_name", "namespace", "producer_name"}

	gieKV      = gauge("inference_pool_average_kv_cache_utilization", "Average KV-cache utilization (0..1) of the pool's ready model servers.", poolLabels)
	gieQueue   = gauge("inference_pool_average_queue_size", "Average number of requests waiting in the pool's ready model servers' queues.", poolLabels)
	gieRunning = gauge("inference_pool_average_running_requests", "Average number of requests running on the pool's ready model servers.", poolLabels)
	gieReady   = gauge("inference_pool_ready_pods", "Model-server endpoints of the pool that are routing candidates.", poolLabels)
	giePerPod  = gauge("inference_pool_per_pod_queue_size", "Requests waiting in each model server's queue.", []string{"name", "model_server_pod"})

	llmdReady      = gauge("llm_d_epp_ready_endpoints", "Model-server endpoints of the pool that are routing candidates.", poolLabels)
	llmdQueue      = gauge("llm_d_epp_average_queue_size", "Average number of requests waiting in the pool's ready model servers' queues.", poolLabels)
	llmdQueueStd   = gauge("llm_d_epp_std_dev_queue_size", "Population standard deviation of the queue length across the pool's ready model servers.", poolLabels)
	llmdRunning    = gauge("llm_d_epp_average_running_requests", "Average number of requests running on the pool's ready model servers.", poolLabels)
	llmdRunningStd = gauge("llm_d_epp_std_dev_running_requests", "Population standard deviation of the running requests across the pool's ready model servers.", poolLabels)
	llmdKV         = gauge("llm_d_epp_average_kv_cache_utilization", "Average KV-cache utilization (0..1) of the pool's ready model servers.", poolLabels)
	llmdKVStd      = gauge("llm_d_epp_std_dev_kv_cache_utilization", "Population standard deviation of the KV-cache utilization across the pool's ready model servers.", poolLabels)
	// llm-d's label names: model_server_endpoint for the per-endpoint
	// queue; endpoint_name, namespace, producer_name for in-flight load.
	llmdPerEP    = gauge("llm_d_epp_per_endpoint_queue_size", "Requests waiting in each model server's queue.", []string{"name", "model_server_endpoint"})
	llmdInflight = gauge("llm_d_epp_inflight_requests", "Requests the picker routed to an endpoint whose response has not finished.", inflightLabels)
	llmdTokens   = gauge("llm_d_epp_inflight_tokens", "Estimated prompt and output tokens of the picker's in-flight requests per endpoint.", inflightLabels)
	// The live load model (extproc/endpoints).
	prefillTokens   = gauge("kvgate_endpoint_prefill_backlog_tokens", "Uncached prompt tokens of the requests routed to an endpoint that have not produced a first token.", endpointLabels)
	prefillRequests = gauge("kvgate_endpoint_prefill_backlog_requests", "Requests routed to an endpoint that have not produced a first token.", endpointLabels)
	decodeRequests  = gauge("kvgate_endpoint_decode_requests", "Requests routed to an endpoint that are producing output.", endpointLabels)
	foreignRequests = gauge("kvgate_endpoint_foreign_requests", "Requests an endpoint reported at its last scrape beyond those the picker routed there (other pickers, direct clients).", endpointLabels)

	age   = gauge("kvgate_endpoint_metrics_age_seconds", "Seconds since the endpoint's metrics were last scraped successfully; +Inf if never.", endpointLabels)
	ready = gauge("kvgate_endpoint_ready", "1 if the endpoint is a routing candidate, 0 if its scrapes are failing.", endpointLabels)
)

// NamespaceLabel is the endpoint label giving its pod's namespace, when
// discovery knows it.
const NamespaceLabel = "namespace"

// InflightProducer is the producer_name of the in-flight gauges: the
// picker's own account of the requests it routed, which is what llm-d's
// inflight-load-producer keeps (kvgate keeps it whether or not that plugin
// is configured).
const InflightProducer = "inflight-load-producer"

// stdDev is the population standard deviation from E[x²] and E[x],
// clamped: rounding can leave E[x²]−E[x]² a hair below zero.
func stdDev(meanSq, mean float64) float64 { return math.Sqrt(max(0, meanSq-mean*mean)) }

func gauge(name, help string, labels []string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// Collector computes the pool's gauges from a datastore at scrape time.
type Collector struct {
	pool string
	ds   *endpoints.Datastore
	now  func() time.Time
}

// New returns a collector for the pool named pool.
func New(pool string, ds *endpoints.Datastore) *Collector {
	return &Collector{pool: pool, ds: ds, now: time.Now}
}

// Register adds a collector for the pool to reg. A registry holds one
// pool: a second pool's collector has the same descriptors and is refused.
func Register(reg prometheus.Registerer, pool string, ds *endpoints.Datastore) error {
	return reg.Register(New(pool, ds))
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{gieKV, gieQueue, gieRunning, gieReady, giePerPod,
		llmdReady, llmdQueue, llmdQueueStd, llmdRunning, llmdRunningStd, llmdKV, llmdKVStd, llmdPerEP, llmdInflight, llmdTokens, prefillTokens, prefillRequests, decodeRequests, foreignRequests, age, ready} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	emit := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	now := c.now()

	cands := c.ds.Candidates()
	isCandidate := make(map[*endpoints.Endpoint]bool, len(cands))
	var n, queue, queueSq, running, runningSq, kv, kvSq float64
	for _, e := range cands {
		isCandidate[e] = true
		m := e.Metrics()
		if m.UpdateTime.IsZero() {
			continue
		}
		q := float64(m.WaitingQueueSize)
		n++
		queue += q
		queueSq += q * q
		r := float64(m.RunningRequests)
		running += r
		runningSq += r * r
		kv += m.KVCacheUsage
		kvSq += m.KVCacheUsage * m.KVCacheUsage
	}
	var avgQueue, stdQueue, avgRunning, stdRunning, avgKV, stdKV float64
	if n > 0 {
		avgQueue, avgRunning, avgKV = queue/n, running/n, kv/n
		stdQueue, stdRunning, stdKV = stdDev(queueSq/n, avgQueue), stdDev(runningSq/n, avgRunning), stdDev(kvSq/n, avgKV)
	}
	readyCount := float64(len(cands))

	emit(gieReady, readyCount, c.pool)
	emit(gieQueue, avgQueue, c.pool)
	emit(gieRunning, avgRunning, c.pool)
	emit(gieKV, avgKV, c.pool)
	emit(llmdReady, readyCount, c.pool)
	emit(llmdQueue, avgQueue, c.pool)
	emit(llmdQueueStd, stdQueue, c.pool)
	emit(llmdRunning, avgRunning, c.pool)
	emit(llmdRunningStd, stdRunning, c.pool)
	emit(llmdKV, avgKV, c.pool)
	emit(llmdKVStd, stdKV, c.pool)

	for _, e := range c.ds.All() {
		name := e.Name()
		m := e.Metrics()
		if !m.UpdateTime.IsZero() {
			q := float64(m.WaitingQueueSize)
			emit(giePerPod, q, c.pool, name)
			emit(llmdPerEP, q, c.pool, name)
		}
		ns := e.Label(NamespaceLabel)
		emit(llmdInflight, float64(e.InflightRequests()), name, ns, InflightProducer)
		emit(llmdTokens, float64(e.InflightTokens()), name, ns, InflightProducer)
		l := e.Load()
		emit(prefillTokens, float64(l.PrefillTokens), c.pool, name)
		emit(prefillRequests, float64(l.PrefillRequests), c.pool, name)
		emit(decodeRequests, float64(l.DecodeRequests), c.pool, name)
		emit(foreignRequests, float64(l.ExternalWaiting+l.ExternalRunning), c.pool, name)
		a := math.Inf(1)
		if !m.UpdateTime.IsZero() {
			a = now.Sub(m.UpdateTime).Seconds()
		}
		emit(age, a, c.pool, name)
		r := 0.0
		if isCandidate[e] {
			r = 1
		}
		emit(ready, r, c.pool, name)
	}
}
