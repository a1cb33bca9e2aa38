package kvevents

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/kvindex"
)

// Reasons a received message was not applied, the reason label of
// kvgate_kvevents_dropped_total.
const (
	dropQueueFull = "queue_full"
	dropBadFrames = "bad_frames"
	dropBadTopic  = "bad_topic"
	// dropUnknownEndpoint: a central-socket message whose topic names no
	// endpoint of the pool (a pod already removed, or a stray publisher),
	// or a message queued for an endpoint just as it was removed.
	dropUnknownEndpoint = "unknown_endpoint"
	// dropUnauthorized: a central-socket topic naming an endpoint the
	// connection may not publish for (Config.Authorize).
	dropUnauthorized = "unauthorized"
	// dropConflictingStream: a message for an endpoint whose stream comes
	// on another connection that is still open.
	dropConflictingStream = "conflicting_stream"
	// dropSequenceRegression: a sequence number going back on one
	// connection; the connection is closed.
	dropSequenceRegression = "sequence_regression"
	// dropMemory: a batch whose decoded events the connection's share of
	// the memory budget could not hold; the endpoint is cleared.
	dropMemory = "memory"
)

// Replay outcomes, the result label of kvgate_kvevents_replays_total.
const (
	replayOK      = "ok"      // the gap was filled
	replayPartial = "partial" // the publisher no longer held its start; cleared
	replayFailed  = "failed"  // no answer or a broken stream; cleared
)

type metrics struct {
	batches      prometheus.Counter
	events       *prometheus.CounterVec
	gaps         prometheus.Counter
	restarts     prometheus.Counter
	replays      *prometheus.CounterVec
	decodeErrors prometheus.Counter
	dropped      *prometheus.CounterVec
	// rankMismatches counts data-parallel rank tags that do not fit the
	// pool (mismatchStart, mismatchNoEndpoint).
	rankMismatches *prometheus.CounterVec
	// unreachable counts per-endpoint sockets that stayed unreachable
	// through the longest redial backoff.
	unreachable prometheus.Counter
	indexErrors prometheus.Counter
	forgotten   prometheus.Counter
	conns       prometheus.Gauge
	rejected    *prometheus.CounterVec
	closed      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, idx *kvindex.Index, queued func() int, queuedBytes func() int64) (*metrics, error) {
	m := &metrics{
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_kvevents_batches_total", Help: "KV event batches applied to the index.",
		}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_kvevents_events_total", Help: "KV events applied, by type (unknown: skipped types).",
		}, []string{"type"}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_kvevents_sequence_gaps_total", Help: "Gaps detected in publishers' sequence numbers.",
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_kvevents_publisher_restarts_total", Help: "Publishers seen restarting (sequence going back).",
		}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_kvevents_replays_total", Help: "Replay requests to publishers, by result (ok, partial, failed).",
		}, []string{"result"}),
		decodeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_kvevents_decode_errors_total", Help: "Batches that could not be decoded (the endpoint is cleared).",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_kvevents_dropped_total", Help: "Messages not applied, by reason.",
		}, []string{"reason"}),
		rankMismatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_kvevents_rank_mismatches_total",
			Help: "Batches whose data-parallel rank tag does not fit their server's endpoints, by reason (start: it puts the server's first rank elsewhere than its other connections did; no_endpoint: the server has no endpoint for that rank, and the batch stays where it arrived).",
		}, []string{"reason"}),
		unreachable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_kvevents_publishers_unreachable_total",
			Help: "Times an endpoint's own KV-event socket stayed unreachable through the longest redial backoff (a wrong address or port; for a data-parallel rank, a pod whose ranks do not start at 0 with its ports not moved back by its first rank).",
		}),
		indexErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_kvevents_index_errors_total", Help: "Events the index refused (too many endpoints).",
		}),
		forgotten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_kvevents_forgotten_endpoints_total", Help: "Endpoint sequence states dropped to stay within MaxEndpoints.",
		}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_kvevents_connections", Help: "KV-event connections open past their handshake.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_kvevents_connections_rejected_total", Help: "Connections turned away, by reason (admission, max_conns, handshake).",
		}, []string{"reason"}),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_kvevents_connections_closed_total", Help: "Connections ended, by reason (too_large, memory, protocol, timeout, closed).",
		}, []string{"reason"}),
	}
	for _, t := range []string{"BlockStored", "BlockRemoved", "AllBlocksCleared", "unknown"} {
		m.events.WithLabelValues(t)
	}
	for _, r := range []string{replayOK, replayPartial, replayFailed} {
		m.replays.WithLabelValues(r)
	}
	for _, r := range []string{dropQueueFull, dropBadFrames, dropBadTopic, dropUnknownEndpoint, dropUnauthorized, dropConflictingStream, dropSequenceRegression, dropMemory} {
		m.dropped.WithLabelValues(r)
	}
	for _, r := range []string{mismatchStart, mismatchNoEndpoint} {
		m.rankMismatches.WithLabelValues(r)
	}
	for _, r := range []string{"admission", "max_conns", "handshake"} {
		m.rejected.WithLabelValues(r)
	}
	for _, r := range []string{"too_large", "memory", "protocol", "timeout", "closed"} {
		m.closed.WithLabelValues(r)
	}
	queue := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvgate_kvevents_queued_messages", Help: "Messages waiting in the subscriber's worker queues.",
	}, func() float64 { return float64(queued()) })
	queueBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvgate_kvevents_held_bytes", Help: "Bytes of KV-event messages being read or waiting to be applied (bounded by the memory budget).",
	}, func() float64 { return float64(queuedBytes()) })
	for _, c := range []prometheus.Collector{
		m.batches, m.events, m.gaps, m.restarts, m.replays, m.decodeErrors, m.dropped, m.rankMismatches, m.unreachable, m.indexErrors,
		m.forgotten, m.conns, m.rejected, m.closed, queue, queueBytes, indexCollector{idx},
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("kvevents: register metrics: %w", err)
		}
	}
	// GIE's approximate prefix scorer exports the same name for its own
	// index; when it is registered already, that one stays.
	if err := reg.Register(prefixIndexerSize{idx}); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("kvevents: register metrics: %w", err)
		}
	}
	return m, nil
}

var (
	indexEntriesDesc   = prometheus.NewDesc("kvgate_kvindex_entries", "(block, endpoint) entries in the KV block index.", nil, nil)
	indexBlocksDesc    = prometheus.NewDesc("kvgate_kvindex_blocks", "Distinct block hashes in the KV block index.", nil, nil)
	indexBytesDesc     = prometheus.NewDesc("kvgate_kvindex_bytes", "Estimated memory held by the KV block index.", nil, nil)
	indexEndpointsDesc = prometheus.NewDesc("kvgate_kvindex_endpoints", "Endpoints with entries in the KV block index.", nil, nil)
	indexEvictionsDesc = prometheus.NewDesc("kvgate_kvindex_evictions_total", "Blocks evicted from the KV block index by its bound.", nil, nil)
	gieIndexerSizeDesc = prometheus.NewDesc("inference_extension_prefix_indexer_size", "Size of the prefix indexer (KV block index entries).", nil, nil)
)

// indexCollector reads the index's stats once per scrape.
type indexCollector struct{ idx *kvindex.Index }

func (c indexCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{indexEntriesDesc, indexBlocksDesc, indexBytesDesc, indexEndpointsDesc, indexEvictionsDesc} {
		ch <- d
	}
}

func (c indexCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.idx.Stats()
	ch <- prometheus.MustNewConstMetric(indexEntriesDesc, prometheus.GaugeValue, float64(st.Entries))
	ch <- prometheus.MustNewConstMetric(indexBlocksDesc, prometheus.GaugeValue, float64(st.Blocks))
	ch <- prometheus.MustNewConstMetric(indexBytesDesc, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(indexEndpointsDesc, prometheus.GaugeValue, float64(st.Endpoints))
	ch <- prometheus.MustNewConstMetric(indexEvictionsDesc, prometheus.CounterValue, float64(st.Evictions))
}

type prefixIndexerSize struct{ idx *kvindex.Index }

func (c prefixIndexerSize) Describe(ch chan<- *prometheus.Desc) { ch <- gieIndexerSizeDesc }

func (c prefixIndexerSize) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(gieIndexerSizeDesc, prometheus.GaugeValue, float64(c.idx.Stats().Entries))
}
