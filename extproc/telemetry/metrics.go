package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descAgents    = prometheus.NewDesc("kvgate_telemetry_agents", "Node agents the picker subscribes to.", nil, nil)
	descConnected = prometheus.NewDesc("kvgate_telemetry_agents_streaming", "Node agents whose telemetry stream is open and has sent a report.", nil, nil)
	descNodes     = prometheus.NewDesc("kvgate_telemetry_nodes", "Nodes with fresh telemetry.", nil, nil)
	descReports   = prometheus.NewDesc("kvgate_telemetry_reports_total", "Telemetry reports received.", nil, nil)
	descStreamErr = prometheus.NewDesc("kvgate_telemetry_stream_failures_total", "Telemetry streams that ended or could not open (each retried with backoff).", nil, nil)
)

// Describe implements prometheus.Collector.
func (s *Store) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAgents, descConnected, descNodes, descReports, descStreamErr} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Store) Collect(ch chan<- prometheus.Metric) {
	nodes := len(s.Nodes())
	ch <- prometheus.MustNewConstMetric(descAgents, prometheus.GaugeValue, float64(s.stats.agents.Load()))
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, float64(s.stats.streaming.Load()))
	ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(nodes))
	ch <- prometheus.MustNewConstMetric(descReports, prometheus.CounterValue, float64(s.stats.reports.Load()))
	ch <- prometheus.MustNewConstMetric(descStreamErr, prometheus.CounterValue, float64(s.stats.failures.Load()))
}
