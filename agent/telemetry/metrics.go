package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The per-peer series: one per (peer, class), bounded by the sources'
// own bounds (TransferTracker's MaxPeers).
var (
	peerLabels     = []string{"peer", "class"}
	descSRTT       = prometheus.NewDesc("kvgate_agent_peer_srtt_seconds", "Smoothed round-trip time to the peer (class nixl: of the NIXL READs).", peerLabels, nil)
	descMinRTT     = prometheus.NewDesc("kvgate_agent_peer_min_rtt_seconds", "Smallest round-trip time to the peer.", peerLabels, nil)
	descThroughput = prometheus.NewDesc("kvgate_agent_peer_throughput_bytes_per_second", "Smoothed achieved throughput from the peer.", peerLabels, nil)
	descBytes      = prometheus.NewDesc("kvgate_agent_peer_bytes_total", "Bytes acknowledged (TCP) or read (nixl) from the peer.", peerLabels, nil)
	descRetrans    = prometheus.NewDesc("kvgate_agent_peer_retransmits_total", "TCP retransmits to the peer.", peerLabels, nil)
)

// PeerCollector exports a PeerSource's figures as Prometheus metrics.
type PeerCollector struct{ Source PeerSource }

// Describe implements prometheus.Collector.
func (c PeerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSRTT, descMinRTT, descThroughput, descBytes, descRetrans} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c PeerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.Source.Peers() {
		l := []string{p.Peer.String(), p.Class}
		ch <- prometheus.MustNewConstMetric(descSRTT, prometheus.GaugeValue, p.SRTT.Seconds(), l...)
		ch <- prometheus.MustNewConstMetric(descMinRTT, prometheus.GaugeValue, p.MinRTT.Seconds(), l...)
		ch <- prometheus.MustNewConstMetric(descThroughput, prometheus.GaugeValue, p.ThroughputBytesPerSec, l...)
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(p.BytesAcked), l...)
		ch <- prometheus.MustNewConstMetric(descRetrans, prometheus.CounterValue, float64(p.Retransmits), l...)
	}
}
