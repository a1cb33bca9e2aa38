// Package vllm holds the parts of vLLM's interface that more than one
// kvgate component must spell the same way: the Prometheus metric and label
// names of a server's /metrics page, and the kv_transfer_params object that
// carries P/D disaggregation between a prefill and a decode server.
//
// The simulator produces these and the picker (and the demo's report)
// consume them. Neither side would notice the other drifting: a metric the
// scraper looks up under another name just reads as absent, and a renamed
// JSON field is silently ignored. So they are declared once, here, against
// vLLM's own spelling; this package has no behaviour of its own.
package vllm
