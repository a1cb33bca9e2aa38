package kvindex

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testutil"
)

// The index's work shows under llm-d's kv_cache_index_* names and their
// deprecated kvcache_index_* twins: admissions and removals in block
// hashes, lookups, and per lookup the best candidate's leading run.
func TestCollectorCountsActivity(t *testing.T) {
	idx := New(Config{})
	if err := idx.Add("a", TierGPU, []uint64{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	if err := idx.Add("b", TierGPU, []uint64{1, 2}); err != nil {
		t.Fatal(err)
	}
	idx.Remove("a", TierGPU, []uint64{4})
	out := make([]float64, 2)
	if n := idx.Lookup([]uint64{1, 2, 3, 9}, []string{"a", "b"}, out); n != 3 {
		t.Fatalf("lookup matched %d, want 3", n)
	}
	if n := idx.Lookup([]uint64{7}, []string{"a", "b"}, out); n != 0 {
		t.Fatalf("lookup matched %d, want 0", n)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(NewCollector(idx)); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	var latencyCount uint64
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		if h := m.GetHistogram(); h != nil {
			latencyCount = h.GetSampleCount()
			if len(h.GetBucket()) != len(LookupLatencyBuckets) {
				t.Errorf("%s: %d buckets, want %d", mf.GetName(), len(h.GetBucket()), len(LookupLatencyBuckets))
			}
			continue
		}
		got[mf.GetName()] = m.GetCounter().GetValue()
	}
	for _, m := range []struct {
		names metricNames
		v     float64
	}{{admissionsNames, 6}, {evictionsNames, 1}, {lookupsNames, 2}, {hitsNames, 3}, {maxPodNames, 3}} {
		for _, n := range []string{m.names.current, m.names.deprecated} {
			if got[n] != m.v {
				t.Errorf("%s = %v, want %v", n, got[n], m.v)
			}
		}
	}
	if latencyCount != 2 {
		t.Errorf("lookup latency count %d, want 2", latencyCount)
	}
}

// LogMetrics logs the activity at its interval until its context ends.
func TestLogMetrics(t *testing.T) {
	idx := New(Config{})
	if err := idx.Add("a", TierGPU, []uint64{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	idx.Lookup([]uint64{1, 2}, []string{"a"}, make([]float64, 1))
	var buf testutil.SyncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { idx.LogMetrics(ctx, log, time.Millisecond); close(done) }()
	for !strings.Contains(buf.String(), "\n") {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	var line map[string]any
	if err := json.Unmarshal([]byte(strings.SplitN(buf.String(), "\n", 2)[0]), &line); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"admissions": 3, "lookups": 1, "hits": 2, "latency_count": 1, "blocks": 3, "entries": 3, "endpoints": 1} {
		if line[k] != want {
			t.Errorf("%s = %v, want %v (%v)", k, line[k], want, line)
		}
	}
	if line["msg"] != "kv-block index metrics" {
		t.Errorf("message %v", line["msg"])
	}
}
