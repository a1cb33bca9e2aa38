// Package dashboards checks kvgate's metrics against the PromQL that users
// of llm-d and the Gateway API Inference Extension already run: the panels
// of their Grafana dashboards (the workplace's shared/DASHBOARDS.md) and
// the KEDA / HPA queries of llm-d's autoscaling guides
// (testdata/autoscaling.md).
//
// The package parses those lists (Parse) and names the metrics an
// expression reads (MetricNames). Its test starts Debian's prometheus,
// scrapes a live fleet (simulators, picker, gateway) over loopback under
// load, evaluates every expression through Prometheus's HTTP API, and fails
// for any expression that returns nothing unless a feature kvgate does not
// build yet explains it (see reasons_test.go).
package dashboards
