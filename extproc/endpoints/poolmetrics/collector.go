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

	gieKV      = gauge("inference_pool_average_kv_cache_utilization", "Average KV-cache utilization (0..1) of the pool's ready model servers.", poolLabels)
	gieQueue   = gauge("inference_pool_average_queue_size", "Average number of requests waiting in the pool's ready model servers' queues.", poolLabels)
	gieRunning = gauge("inference_pool_average_running_requests", "Average number of requests running on the pool's ready model servers.", poolLabels)
	gieReady   = gauge("inference_pool_ready_pods", "Model-server endpoints of the pool that are routing candidates.", poolLabels)
	giePerPod  = gauge("inference_pool_per_pod_queue_size", "Requests waiting in each model server's queue.", []string{"name", "model_server_pod"})

	llmdReady    = gauge("llm_d_epp_ready_endpoints", "Model-server endpoints of the pool that are routing candidates.", poolLabels)
	llmdQueue    = gauge("llm_d_epp_average_queue_size", "Average number of requests waiting in the pool's ready model servers' queues.", poolLabels)
	llmdQueueStd = gauge("llm_d_epp_std_dev_queue_size", "Population standard deviation of the queue length across the pool's ready model servers.", poolLabels)
	llmdRunning  = gauge("llm_d_epp_average_running_requests", "Average number of requests running on the pool's ready model servers.", poolLabels)
	llmdKV       = gauge("llm_d_epp_average_kv_cache_utilization", "Average KV-cache utilization (0..1) of the pool's ready model servers.", poolLabels)
	llmdPerEP    = gauge("llm_d_epp_per_endpoint_queue_size", "Requests waiting in each model server's queue.", endpointLabels)
	llmdInflight = gauge("llm_d_epp_inflight_requests", "Requests the picker routed to an endpoint whose response has not finished.", endpointLabels)
	llmdTokens   = gauge("llm_d_epp_inflight_tokens", "Estimated prompt and output tokens of the picker's in-flight requests per endpoint.", endpointLabels)
	// The live load model (extproc/endpoints).
	prefillTokens   = gauge("kvgate_endpoint_prefill_backlog_tokens", "Uncached prompt tokens of the requests routed to an endpoint that have not produced a first token.", endpointLabels)
	prefillRequests = gauge("kvgate_endpoint_prefill_backlog_requests", "Requests routed to an endpoint that have not produced a first token.", endpointLabels)
	decodeRequests  = gauge("kvgate_endpoint_decode_requests", "Requests routed to an endpoint that are producing output.", endpointLabels)
	foreignRequests = gauge("kvgate_endpoint_foreign_requests", "Requests an endpoint reported at its last scrape beyond those the picker routed there (other pickers, direct clients).", endpointLabels)

	age   = gauge("kvgate_endpoint_metrics_age_seconds", "Seconds since the endpoint's metrics were last scraped successfully; +Inf if never.", endpointLabels)
	ready = gauge("kvgate_endpoint_ready", "1 if the endpoint is a routing candidate, 0 if its scrapes are failing.", endpointLabels)
)

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
		llmdReady, llmdQueue, llmdQueueStd, llmdRunning, llmdKV, llmdPerEP, llmdInflight, llmdTokens, prefillTokens, prefillRequests, decodeRequests, foreignRequests, age, ready} {
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
	var n, queue, queueSq, running, kv float64
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
		running += float64(m.RunningRequests)
		kv += m.KVCacheUsage
	}
	var avgQueue, stdQueue, avgRunning, avgKV float64
	if n > 0 {
		avgQueue, avgRunning, avgKV = queue/n, running/n, kv/n
		// Clamp: rounding can leave E[q²]−E[q]² a hair below zero.
		stdQueue = math.Sqrt(max(0, queueSq/n-avgQueue*avgQueue))
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
	emit(llmdKV, avgKV, c.pool)

	for _, e := range c.ds.All() {
		name := e.Name()
		m := e.Metrics()
		if !m.UpdateTime.IsZero() {
			q := float64(m.WaitingQueueSize)
			emit(giePerPod, q, c.pool, name)
			emit(llmdPerEP, q, c.pool, name)
		}
		emit(llmdInflight, float64(e.InflightRequests()), c.pool, name)
		emit(llmdTokens, float64(e.InflightTokens()), c.pool, name)
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
