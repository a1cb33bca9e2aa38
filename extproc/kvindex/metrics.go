package kvindex

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// activity counts what the index was asked to do, for llm-d's
// kv_cache_index_* metrics. Lock-free: lookups run concurrently.
type activity struct {
	admissions atomic.Uint64 // block hashes added
	removals   atomic.Uint64 // block hashes removed by events
	lookups    atomic.Uint64
	hits       atomic.Uint64 // per lookup, the leading blocks the best candidate holds
	latency    latencyHistogram
}

// LookupLatencyBuckets are the lookup latency histogram's upper bounds in
// seconds: Prometheus's default buckets, as llm-d-kv-cache uses.
var LookupLatencyBuckets = prometheus.DefBuckets

// latencyHistogram is a fixed-bucket histogram updated with atomics.
type latencyHistogram struct {
	count, sumNanos atomic.Uint64
	// counts has one slot per bucket plus one above every bound.
	counts [16]atomic.Uint64
}

func (h *latencyHistogram) observe(d time.Duration) {
	i, _ := slices.BinarySearch(LookupLatencyBuckets, d.Seconds())
	h.counts[min(i, len(h.counts)-1)].Add(1)
	h.sumNanos.Add(uint64(max(d, 0)))
	h.count.Add(1)
}

func (h *latencyHistogram) snapshot() (count uint64, sum float64, buckets map[float64]uint64) {
	buckets = make(map[float64]uint64, len(LookupLatencyBuckets))
	var cum uint64
	for i, ub := range LookupLatencyBuckets {
		cum += h.counts[i].Load()
		buckets[ub] = cum
	}
	// Read last: a concurrent observation then shows in the buckets no
	// later than in the count, so count >= every bucket.
	count = max(h.count.Load(), cum)
	return count, float64(h.sumNanos.Load()) / 1e9, buckets
}

// Activity is a snapshot of the index's work since New.
type Activity struct {
	Admissions uint64 // block hashes added (Add)
	// Evictions are block hashes removed by Remove plus blocks dropped by
	// the bound.
	Evictions uint64
	Lookups   uint64
	// LookupHits sums, over lookups, the leading blocks the best candidate
	// holds (Lookup's return value).
	LookupHits uint64
}

// Activity reads the counters.
func (idx *Index) Activity() Activity {
	var bound uint64
	for _, s := range idx.shards {
		s.mu.RLock()
		bound += s.evictions
		s.mu.RUnlock()
	}
	return Activity{
		Admissions: idx.act.admissions.Load(),
		Evictions:  idx.act.removals.Load() + bound,
		Lookups:    idx.act.lookups.Load(),
		LookupHits: idx.act.hits.Load(),
	}
}

// metricNames pairs llm-d's current name with the deprecated one it still
// emits (llm-d-router pkg/kvcache/metrics).
type metricNames struct{ current, deprecated string }

var (
	admissionsNames = metricNames{"llm_d_epp_kv_cache_index_admissions_total", "kvcache_index_admissions_total"}
	evictionsNames  = metricNames{"llm_d_epp_kv_cache_index_evictions_total", "kvcache_index_evictions_total"}
	lookupsNames    = metricNames{"llm_d_epp_kv_cache_index_lookup_requests_total", "kvcache_index_lookup_requests_total"}
	hitsNames       = metricNames{"llm_d_epp_kv_cache_index_lookup_hits_total", "kvcache_index_lookup_hits_total"}
	maxPodNames     = metricNames{"llm_d_epp_kv_cache_index_max_pod_hit_count_total", "kvcache_index_max_pod_hit_count_total"}
	latencyNames    = metricNames{"llm_d_epp_kv_cache_index_lookup_latency_seconds", "kvcache_index_lookup_latency_seconds"}
)

// Collector exports an index's activity under llm-d's KV-cache index
// metric names, each also under its deprecated kvcache_index_* name.
type Collector struct {
	idx   *Index
	descs map[string]*prometheus.Desc
}

// NewCollector returns a collector for idx.
func NewCollector(idx *Index) *Collector {
	c := &Collector{idx: idx, descs: map[string]*prometheus.Desc{}}
	for _, n := range []struct {
		names metricNames
		help  string
	}{
		{admissionsNames, "Total number of KV-block admissions."},
		{evictionsNames, "Total number of KV-block evictions (removals reported by the servers and blocks dropped by the index's bound)."},
		{lookupsNames, "Total number of lookup calls."},
		{hitsNames, "Contiguous prefix blocks matched by the best pod per lookup."},
		{maxPodNames, "Longest contiguous per-pod prefix chain observed per lookup."},
		{latencyNames, "Latency of Lookup calls in seconds."},
	} {
		c.descs[n.names.current] = prometheus.NewDesc(n.names.current, n.help, nil, nil)
		c.descs[n.names.deprecated] = prometheus.NewDesc(n.names.deprecated, "Deprecated: use "+n.names.current+". "+n.help, nil, nil)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	a := c.idx.Activity()
	counter := func(n metricNames, v uint64) {
		for _, name := range []string{n.current, n.deprecated} {
			ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v))
		}
	}
	counter(admissionsNames, a.Admissions)
	counter(evictionsNames, a.Evictions)
	counter(lookupsNames, a.Lookups)
	counter(hitsNames, a.LookupHits)
	counter(maxPodNames, a.LookupHits)
	count, sum, buckets := c.idx.act.latency.snapshot()
	for _, name := range []string{latencyNames.current, latencyNames.deprecated} {
		ch <- prometheus.MustNewConstHistogram(c.descs[name], count, sum, buckets)
	}
}

// LogMetrics logs the index's activity every interval until ctx ends, as
// llm-d-kv-cache's kvBlockIndexConfig.metricsLoggingInterval does: the
// counters of the kv_cache_index_* metrics, the lookup latency's count,
// sum and mean, and the index's size.
func (idx *Index) LogMetrics(ctx context.Context, log *slog.Logger, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a, st := idx.Activity(), idx.Stats()
		count, sum, _ := idx.act.latency.snapshot()
		mean := 0.0
		if count > 0 {
			mean = sum / float64(count)
		}
		log.LogAttrs(ctx, slog.LevelInfo, "kv-block index metrics",
			slog.Uint64("admissions", a.Admissions), slog.Uint64("evictions", a.Evictions),
			slog.Uint64("lookups", a.Lookups), slog.Uint64("hits", a.LookupHits),
			slog.Uint64("latency_count", count), slog.Float64("latency_sum_seconds", sum), slog.Float64("latency_avg_seconds", mean),
			slog.Int64("blocks", st.Blocks), slog.Int64("entries", st.Entries), slog.Int("endpoints", st.Endpoints))
	}
}
