package netobs

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// histogram is a fixed-bucket histogram kept per aggregate, exported as a
// const histogram so that a forgotten peer's series go with it.
type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	n      uint64
}

var (
	// rttBuckets: 25 µs to about 3.3 s, doubling.
	rttBuckets = prometheus.ExponentialBuckets(25e-6, 2, 18)
	// transferBuckets: 100 µs to about 13 s, doubling.
	transferBuckets = prometheus.ExponentialBuckets(100e-6, 2, 18)
)

func newHistogram(bounds []float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	h.counts[sort.SearchFloat64s(h.bounds, v)]++
	h.sum += v
	h.n++
}

func (h *histogram) buckets() map[float64]uint64 {
	m := make(map[float64]uint64, len(h.bounds))
	var c uint64
	for i, b := range h.bounds {
		c += h.counts[i]
		m[b] = c
	}
	return m
}

var (
	peerLabels = []string{"peer", "class"}
	mapLabels  = []string{"map"}

	descRTT        = prometheus.NewDesc("kvgate_netobs_tcp_srtt_seconds", "Smoothed TCP RTT of each open flow, observed once per poll in which the flow took an RTT sample.", peerLabels, nil)
	descSRTT       = prometheus.NewDesc("kvgate_netobs_tcp_smoothed_rtt_seconds", "Mean smoothed TCP RTT of the peer's flows that took a sample in the last poll.", peerLabels, nil)
	descMinRTT     = prometheus.NewDesc("kvgate_netobs_tcp_min_rtt_seconds", "Lowest windowed minimum RTT of the peer's open flows.", peerLabels, nil)
	descFlows      = prometheus.NewDesc("kvgate_netobs_tcp_flows", "Open TCP flows to the peer in the class.", peerLabels, nil)
	descRetrans    = prometheus.NewDesc("kvgate_netobs_tcp_retransmits_total", "TCP segments retransmitted to the peer.", peerLabels, nil)
	descAcked      = prometheus.NewDesc("kvgate_netobs_tcp_bytes_acked_total", "Bytes sent to the peer and acknowledged by it.", peerLabels, nil)
	descReceived   = prometheus.NewDesc("kvgate_netobs_tcp_bytes_received_total", "Bytes received from the peer.", peerLabels, nil)
	descThroughput = prometheus.NewDesc("kvgate_netobs_tcp_throughput_bytes_per_second", "Bytes acked by the peer per second over the last poll interval.", peerLabels, nil)

	descXfer           = prometheus.NewDesc("kvgate_netobs_kv_transfer_seconds", "Duration of the agent's NIXL KV transfers (READs) from the peer agent.", peerLabels, nil)
	descXferBytes      = prometheus.NewDesc("kvgate_netobs_kv_transfer_bytes_total", "Bytes moved by the agent's NIXL KV transfers from the peer agent.", peerLabels, nil)
	descXfers          = prometheus.NewDesc("kvgate_netobs_kv_transfers_total", "NIXL KV transfers from the peer agent, by result.", append(peerLabels, "result"), nil)
	descXferThroughput = prometheus.NewDesc("kvgate_netobs_kv_transfer_throughput_bytes_per_second", "Moving average of the NIXL transfers' bytes over their duration.", peerLabels, nil)

	descAttached     = prometheus.NewDesc("kvgate_netobs_bpf_attached", "1 when the sockops program is attached, 0 when the agent runs without it.", nil, nil)
	descMapEntries   = prometheus.NewDesc("kvgate_netobs_bpf_map_entries", "Entries in the BPF map at the last poll.", mapLabels, nil)
	descMapMax       = prometheus.NewDesc("kvgate_netobs_bpf_map_max_entries", "Capacity of the BPF map.", mapLabels, nil)
	descOpened       = prometheus.NewDesc("kvgate_netobs_bpf_flows_opened_total", "Classified flows the sockops program started tracking.", nil, nil)
	descEvents       = prometheus.NewDesc("kvgate_netobs_bpf_events_total", "Sockops callbacks (RTT, retransmit, state) that updated a flow.", nil, nil)
	descMissed       = prometheus.NewDesc("kvgate_netobs_bpf_missed_events_total", "Callbacks of tracked sockets whose flow had been evicted from the full map.", nil, nil)
	descClosed       = prometheus.NewDesc("kvgate_netobs_flows_closed_total", "Flows counted to their close and removed from the map.", nil, nil)
	descEvicted      = prometheus.NewDesc("kvgate_netobs_flows_evicted_total", "Flows that left the LRU map before they closed (their last deltas are lost).", nil, nil)
	descPeersDropped = prometheus.NewDesc("kvgate_netobs_peers_dropped_total", "Flows and transfers not tracked because MaxPeers peers are tracked already.", nil, nil)
	descPeers        = prometheus.NewDesc("kvgate_netobs_peers", "Tracked (peer, class) pairs.", nil, nil)
	descPolls        = prometheus.NewDesc("kvgate_netobs_polls_total", "Reads of the flow map.", nil, nil)
	descPollSeconds  = prometheus.NewDesc("kvgate_netobs_poll_seconds_total", "Time spent reading and accounting the flow map.", nil, nil)
)

// Describe implements prometheus.Collector.
func (t *Tracker) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRTT, descSRTT, descMinRTT, descFlows, descRetrans, descAcked, descReceived,
		descThroughput, descXfer, descXferBytes, descXfers, descXferThroughput, descAttached, descMapEntries, descMapMax,
		descOpened, descEvents, descMissed, descClosed, descEvicted, descPeersDropped, descPeers, descPolls, descPollSeconds} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (t *Tracker) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	c := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	for _, a := range t.aggs {
		peer, class := a.Peer.String(), a.Class
		if class == NIXLClass {
			ch <- prometheus.MustNewConstHistogram(descXfer, a.transfer.n, a.transfer.sum, a.transfer.buckets(), peer, class)
			c(descXferBytes, a.BytesAcked, peer, class)
			c(descXfers, a.Transfers, peer, class, "ok")
			c(descXfers, a.TransferFailures, peer, class, "error")
			g(descXferThroughput, a.ThroughputBytesPerSec, peer, class)
			continue
		}
		ch <- prometheus.MustNewConstHistogram(descRTT, a.rtt.n, a.rtt.sum, a.rtt.buckets(), peer, class)
		g(descSRTT, a.SRTT.Seconds(), peer, class)
		g(descMinRTT, a.MinRTT.Seconds(), peer, class)
		g(descFlows, float64(a.Flows), peer, class)
		c(descRetrans, a.Retransmits, peer, class)
		c(descAcked, a.BytesAcked, peer, class)
		c(descReceived, a.BytesReceived, peer, class)
		g(descThroughput, a.ThroughputBytesPerSec, peer, class)
	}
	attached := 0.0
	if t.bpf != nil {
		attached = 1
		g(descMapEntries, float64(t.counts.mapEntries), "flows")
		g(descMapMax, float64(t.cfg.MaxFlows), "flows")
		c(descOpened, t.counts.bpfOpened)
		c(descEvents, t.counts.bpfEvents)
		c(descMissed, t.counts.bpfMissed)
		c(descClosed, t.counts.flowsClosed)
		c(descEvicted, t.counts.flowsEvicted)
		c(descPolls, t.counts.polls)
		ch <- prometheus.MustNewConstMetric(descPollSeconds, prometheus.CounterValue, t.counts.pollSeconds)
	}
	g(descAttached, attached)
	c(descPeersDropped, t.counts.peersDropped)
	g(descPeers, float64(len(t.aggs)))
}
