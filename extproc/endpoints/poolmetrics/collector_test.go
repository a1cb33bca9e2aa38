package poolmetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

func TestCollector(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ds := endpoints.NewDatastore()
	if err := ds.Replace([]endpoints.Spec{
		{Name: "a", Address: "10.0.0.1:8000"},
		{Name: "b", Address: "10.0.0.2:8000"},
		{Name: "c", Address: "10.0.0.3:8000"}, // failing scrapes
		{Name: "d", Address: "10.0.0.4:8000"}, // never scraped
	}); err != nil {
		t.Fatal(err)
	}
	ds.Get("a").SetMetrics(&endpoints.Metrics{WaitingQueueSize: 2, RunningRequests: 10, KVCacheUsage: 0.25, UpdateTime: now.Add(-50 * time.Millisecond)})
	ds.Get("b").SetMetrics(&endpoints.Metrics{WaitingQueueSize: 6, RunningRequests: 20, KVCacheUsage: 0.75, UpdateTime: now.Add(-2 * time.Second)})
	ds.Get("c").SetMetrics(&endpoints.Metrics{WaitingQueueSize: 100, RunningRequests: 100, KVCacheUsage: 1, UpdateTime: now.Add(-time.Minute)})
	ds.SetHealthy(ds.Get("c"), false)
	// a: three requests routed after its scrape, one of them past its
	// first token; the scrape's own 12 requests are foreign to the picker.
	for i := range 3 {
		c := ds.Get("a").Charge(50, 100, 300, 1000)
		if i == 0 {
			c.FirstToken()
		}
	}
	ds.Get("d").Charge(0, 0, 0, 512)

	c := New("llama", ds)
	c.now = func() time.Time { return now }
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)

	// Pool averages: a and b only (c is not a candidate, d has no metrics).
	// Queue 2 and 6: mean 4, population standard deviation 2.
	const want = `
# HELP inference_pool_average_kv_cache_utilization Average KV-cache utilization (0..1) of the pool's ready model servers.
# TYPE inference_pool_average_kv_cache_utilization gauge
inference_pool_average_kv_cache_utilization{name="llama"} 0.5
# HELP inference_pool_average_queue_size Average number of requests waiting in the pool's ready model servers' queues.
# TYPE inference_pool_average_queue_size gauge
inference_pool_average_queue_size{name="llama"} 4
# HELP inference_pool_average_running_requests Average number of requests running on the pool's ready model servers.
# TYPE inference_pool_average_running_requests gauge
inference_pool_average_running_requests{name="llama"} 15
# HELP inference_pool_per_pod_queue_size Requests waiting in each model server's queue.
# TYPE inference_pool_per_pod_queue_size gauge
inference_pool_per_pod_queue_size{model_server_pod="a",name="llama"} 2
inference_pool_per_pod_queue_size{model_server_pod="b",name="llama"} 6
inference_pool_per_pod_queue_size{model_server_pod="c",name="llama"} 100
# HELP inference_pool_ready_pods Model-server endpoints of the pool that are routing candidates.
# TYPE inference_pool_ready_pods gauge
inference_pool_ready_pods{name="llama"} 3
# HELP kvgate_endpoint_decode_requests Requests routed to an endpoint that are producing output.
# TYPE kvgate_endpoint_decode_requests gauge
kvgate_endpoint_decode_requests{endpoint="a",name="llama"} 1
kvgate_endpoint_decode_requests{endpoint="b",name="llama"} 0
kvgate_endpoint_decode_requests{endpoint="c",name="llama"} 0
kvgate_endpoint_decode_requests{endpoint="d",name="llama"} 0
# HELP kvgate_endpoint_foreign_requests Requests an endpoint reported at its last scrape beyond those the picker routed there (other pickers, direct clients).
# TYPE kvgate_endpoint_foreign_requests gauge
kvgate_endpoint_foreign_requests{endpoint="a",name="llama"} 12
kvgate_endpoint_foreign_requests{endpoint="b",name="llama"} 26
kvgate_endpoint_foreign_requests{endpoint="c",name="llama"} 200
kvgate_endpoint_foreign_requests{endpoint="d",name="llama"} 0
# HELP kvgate_endpoint_metrics_age_seconds Seconds since the endpoint's metrics were last scraped successfully; +Inf if never.
# TYPE kvgate_endpoint_metrics_age_seconds gauge
kvgate_endpoint_metrics_age_seconds{endpoint="a",name="llama"} 0.05
kvgate_endpoint_metrics_age_seconds{endpoint="b",name="llama"} 2
kvgate_endpoint_metrics_age_seconds{endpoint="c",name="llama"} 60
kvgate_endpoint_metrics_age_seconds{endpoint="d",name="llama"} +Inf
# HELP kvgate_endpoint_prefill_backlog_requests Requests routed to an endpoint that have not produced a first token.
# TYPE kvgate_endpoint_prefill_backlog_requests gauge
kvgate_endpoint_prefill_backlog_requests{endpoint="a",name="llama"} 2
kvgate_endpoint_prefill_backlog_requests{endpoint="b",name="llama"} 0
kvgate_endpoint_prefill_backlog_requests{endpoint="c",name="llama"} 0
kvgate_endpoint_prefill_backlog_requests{endpoint="d",name="llama"} 1
# HELP kvgate_endpoint_prefill_backlog_tokens Uncached prompt tokens of the requests routed to an endpoint that have not produced a first token.
# TYPE kvgate_endpoint_prefill_backlog_tokens gauge
kvgate_endpoint_prefill_backlog_tokens{endpoint="a",name="llama"} 200
kvgate_endpoint_prefill_backlog_tokens{endpoint="b",name="llama"} 0
kvgate_endpoint_prefill_backlog_tokens{endpoint="c",name="llama"} 0
kvgate_endpoint_prefill_backlog_tokens{endpoint="d",name="llama"} 0
# HELP kvgate_endpoint_ready 1 if the endpoint is a routing candidate, 0 if its scrapes are failing.
# TYPE kvgate_endpoint_ready gauge
kvgate_endpoint_ready{endpoint="a",name="llama"} 1
kvgate_endpoint_ready{endpoint="b",name="llama"} 1
kvgate_endpoint_ready{endpoint="c",name="llama"} 0
kvgate_endpoint_ready{endpoint="d",name="llama"} 1
# HELP llm_d_epp_average_kv_cache_utilization Average KV-cache utilization (0..1) of the pool's ready model servers.
# TYPE llm_d_epp_average_kv_cache_utilization gauge
llm_d_epp_average_kv_cache_utilization{name="llama"} 0.5
# HELP llm_d_epp_average_queue_size Average number of requests waiting in the pool's ready model servers' queues.
# TYPE llm_d_epp_average_queue_size gauge
llm_d_epp_average_queue_size{name="llama"} 4
# HELP llm_d_epp_average_running_requests Average number of requests running on the pool's ready model servers.
# TYPE llm_d_epp_average_running_requests gauge
llm_d_epp_average_running_requests{name="llama"} 15
# HELP llm_d_epp_inflight_requests Requests the picker routed to an endpoint whose response has not finished.
# TYPE llm_d_epp_inflight_requests gauge
llm_d_epp_inflight_requests{endpoint_name="a",namespace="",producer_name="inflight-load-producer"} 3
llm_d_epp_inflight_requests{endpoint_name="b",namespace="",producer_name="inflight-load-producer"} 0
llm_d_epp_inflight_requests{endpoint_name="c",namespace="",producer_name="inflight-load-producer"} 0
llm_d_epp_inflight_requests{endpoint_name="d",namespace="",producer_name="inflight-load-producer"} 1
# HELP llm_d_epp_inflight_tokens Estimated prompt and output tokens of the picker's in-flight requests per endpoint.
# TYPE llm_d_epp_inflight_tokens gauge
llm_d_epp_inflight_tokens{endpoint_name="a",namespace="",producer_name="inflight-load-producer"} 3000
llm_d_epp_inflight_tokens{endpoint_name="b",namespace="",producer_name="inflight-load-producer"} 0
llm_d_epp_inflight_tokens{endpoint_name="c",namespace="",producer_name="inflight-load-producer"} 0
llm_d_epp_inflight_tokens{endpoint_name="d",namespace="",producer_name="inflight-load-producer"} 512
# HELP llm_d_epp_per_endpoint_queue_size Requests waiting in each model server's queue.
# TYPE llm_d_epp_per_endpoint_queue_size gauge
llm_d_epp_per_endpoint_queue_size{model_server_endpoint="a",name="llama"} 2
llm_d_epp_per_endpoint_queue_size{model_server_endpoint="b",name="llama"} 6
llm_d_epp_per_endpoint_queue_size{model_server_endpoint="c",name="llama"} 100
# HELP llm_d_epp_ready_endpoints Model-server endpoints of the pool that are routing candidates.
# TYPE llm_d_epp_ready_endpoints gauge
llm_d_epp_ready_endpoints{name="llama"} 3
# HELP llm_d_epp_std_dev_kv_cache_utilization Population standard deviation of the KV-cache utilization across the pool's ready model servers.
# TYPE llm_d_epp_std_dev_kv_cache_utilization gauge
llm_d_epp_std_dev_kv_cache_utilization{name="llama"} 0.25
# HELP llm_d_epp_std_dev_queue_size Population standard deviation of the queue length across the pool's ready model servers.
# TYPE llm_d_epp_std_dev_queue_size gauge
llm_d_epp_std_dev_queue_size{name="llama"} 2
# HELP llm_d_epp_std_dev_running_requests Population standard deviation of the running requests across the pool's ready model servers.
# TYPE llm_d_epp_std_dev_running_requests gauge
llm_d_epp_std_dev_running_requests{name="llama"} 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestCollectorEmptyPool(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := Register(reg, "empty", endpoints.NewDatastore()); err != nil {
		t.Fatal(err)
	}
	const want = `
# HELP llm_d_epp_ready_endpoints Model-server endpoints of the pool that are routing candidates.
# TYPE llm_d_epp_ready_endpoints gauge
llm_d_epp_ready_endpoints{name="empty"} 0
# HELP llm_d_epp_std_dev_queue_size Population standard deviation of the queue length across the pool's ready model servers.
# TYPE llm_d_epp_std_dev_queue_size gauge
llm_d_epp_std_dev_queue_size{name="empty"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "llm_d_epp_ready_endpoints", "llm_d_epp_std_dev_queue_size"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 11 {
		t.Errorf("empty pool exports %d series (%v), want the 11 pool-wide ones", n, err)
	}
	// Registering the same pool twice is a caller bug the registry reports.
	if err := Register(reg, "empty", endpoints.NewDatastore()); err == nil {
		t.Error("duplicate registration accepted")
	}
}
