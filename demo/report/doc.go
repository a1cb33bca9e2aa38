// Package report summarises replay runs — latency percentiles, throughput,
// prefix-cache hit rate, per-endpoint spread — and renders them as a text
// table, JSON, and a self-contained HTML page with inline SVG plots.
package report
