// Package dashboards checks kvgate's metrics against the PromQL that users
// of llm-d and the Gateway API Inference Extension already run: the panels
// of their Grafana dashboards (the workplace's shared/DASHBOARDS.md) and
// the KEDA / HPA queries of llm-d's autoscaling guides
// (testdata/autoscaling.md).
//
// The package parses those lists (Parse) and names the metrics an
// expression reads (MetricNames). Its test starts Debian's prometheus,
// scrapes a live fleet over loopback under load (simulators, picker and a
// gateway with body-based routing; a 1P1D pool with node agents, sidecar
// and disagg-profile-handler; the async processor over a real
// redis-server), evaluates every expression through Prometheus's HTTP API,
// and fails for any expression that returns nothing unless
// reasons_test.go accounts for it, or when fewer than 95% return data.
package dashboards
