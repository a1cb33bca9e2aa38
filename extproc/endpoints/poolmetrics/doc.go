// Package poolmetrics exports the pool's state to Prometheus under the names
// existing GIE and llm-d dashboards query, computed from the endpoints
// datastore at scrape time so that nothing is maintained per request.
//
// Label sets, the same on every series of a kind:
//   - pool-wide series carry name (the InferencePool's name, as in GIE);
//   - per-endpoint series carry name and endpoint (the endpoint's name),
//     except GIE's inference_pool_per_pod_queue_size, which keeps its
//     upstream label model_server_pod for the same value.
//
// Averages and the standard deviation are over the candidate (healthy)
// endpoints that have been scraped at least once: a server with no metrics
// yet would read as idle and pull the averages down.
package poolmetrics
