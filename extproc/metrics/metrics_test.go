package metrics

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/internal/openai"
)

// Model names come from clients: past MaxModelLabels distinct names, new
// ones share the OtherModel series instead of growing the registry.
func TestModelLabelsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	for i := range MaxModelLabels + 50 {
		name := fmt.Sprintf("model-%d", i)
		m.RequestReceived(Labels{Model: name, Target: name, FairnessID: "f"}, -1)
	}
	if n := testutil.CollectAndCount(m.gieRequests); n != MaxModelLabels+1 {
		t.Fatalf("%d request series, want %d", n, MaxModelLabels+1)
	}
	if got := testutil.ToFloat64(m.gieRequests.WithLabelValues(OtherModel, OtherModel, "0")); got != 50 {
		t.Fatalf("other series counted %v, want 50", got)
	}
	m.RequestReceived(Labels{Model: "model-3", Target: "model-3", FairnessID: "f"}, -1) // a known name keeps its series
	if got := testutil.ToFloat64(m.requests.WithLabelValues("model-3", "model-3", "f", "0")); got != 2 {
		t.Fatalf("known model counted %v, want 2", got)
	}
}

// TestLabelValueLengthBounded (Medium): long or non-UTF-8 model names go
// to the OtherModel series, so /metrics stays small whatever clients send.
func TestLabelValueLengthBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	long := strings.Repeat("m", 1<<20)
	for i := range 10 {
		m.RequestReceived(Labels{Model: long + fmt.Sprint(i), Target: long, FairnessID: long}, -1)
	}
	m.RequestReceived(Labels{Model: "bad\xff", Target: "bad\xff", FairnessID: "f"}, -1)
	m.RequestReceived(Labels{Model: strings.Repeat("a", MaxLabelValueBytes), Target: "ok", FairnessID: "f"}, -1)
	if got := testutil.ToFloat64(m.gieRequests.WithLabelValues(OtherModel, OtherModel, "0")); got != 11 {
		t.Fatalf("other series counted %v, want 11", got)
	}
	var size int
	for _, mf := range must(reg.Gather()) {
		size += len(mf.String())
	}
	if size > 64<<10 {
		t.Fatalf("exposition is %d bytes after 10 megabyte-long names", size)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Latency predictions land in llm-d's predicted-latency histograms and their
// errors, relative to what happened, in kvgate's error-ratio histogram.
func TestLatencyPredictions(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Predicted("r1", "m", latency.Estimate{TTFT: 200 * time.Millisecond, TPOT: 20 * time.Millisecond})
	m.Predicted("r2", "m", latency.Estimate{TTFT: 300 * time.Millisecond}) // no TPOT (prefill pod)
	m.ObservedTTFT("r1", "m", 200*time.Millisecond, 100*time.Millisecond)  // +100%
	m.ObservedTPOT("r1", "m", 20*time.Millisecond, 25*time.Millisecond)    // -20%
	m.ObservedTTFT("r2", "m", 0, 100*time.Millisecond)                     // no prediction: not scored
	for _, tc := range []struct {
		c    prometheus.Collector
		want int
	}{{m.predTTFT, 2}, {m.predTPOT, 1}} {
		if got := histogramCount(t, tc.c); got != tc.want {
			t.Errorf("%d observations, want %d", got, tc.want)
		}
	}
	if got := histogramSum(t, m.latencyErr.WithLabelValues("ttft").(prometheus.Histogram)); got != 1 {
		t.Errorf("ttft error sum %v, want 1", got)
	}
	if got := histogramSum(t, m.latencyErr.WithLabelValues("tpot").(prometheus.Histogram)); got < -0.2001 || got > -0.1999 {
		t.Errorf("tpot error sum %v, want -0.2", got)
	}
	var none *Metrics // the director records through a nil *Metrics when none is configured
	none.Predicted("r", "m", latency.Estimate{})
	none.ObservedTTFT("r", "m", 1, 1)
	none.TTFT("m", "m", time.Second)
}

func histogramCount(t *testing.T, c prometheus.Collector) int {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	c.Collect(ch)
	close(ch)
	n := 0
	for mt := range ch {
		var pb dto.Metric
		if err := mt.Write(&pb); err != nil {
			t.Fatal(err)
		}
		n += int(pb.GetHistogram().GetSampleCount())
	}
	return n
}

func histogramSum(t *testing.T, h prometheus.Histogram) float64 {
	t.Helper()
	var pb dto.Metric
	if err := h.Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetHistogram().GetSampleSum()
}

// A request's label set resolves its series once; past maxCachedSeries
// label sets the cache evicts, and an evicted set's series keep counting
// where they were.
func TestSeriesCacheBounded(t *testing.T) {
	m := New(prometheus.NewRegistry())
	first := Labels{Model: "m", Target: "m", FairnessID: "tenant-0"}
	m.RequestReceived(first, 10)
	for i := 1; i <= maxCachedSeries+10; i++ {
		m.RequestReceived(Labels{Model: "m", Target: "m", FairnessID: fmt.Sprintf("tenant-%d", i%MaxFairnessLabels), Priority: i}, 10)
	}
	if n := m.series.Len(); n > maxCachedSeries {
		t.Fatalf("%d cached label sets, bound %d", n, maxCachedSeries)
	}
	m.RequestReceived(first, 10)
	if got := testutil.ToFloat64(m.requests.WithLabelValues("m", "m", "tenant-0", "0")); got != 2 {
		t.Fatalf("first label set counted %v after eviction, want 2", got)
	}
	if got := testutil.ToFloat64(m.gieRequests.WithLabelValues("m", "m", "0")); got != 2 {
		t.Fatalf("GIE counter for priority 0 counted %v, want 2", got)
	}
}

// A series appears in /metrics once something is written to it: a label
// set that has only been routed has no response histograms, and a
// non-streaming response has no streaming TTFT or TPOT series.
func TestSeriesAppearWhenWritten(t *testing.T) {
	m := New(prometheus.NewRegistry())
	l := Labels{Model: "m", Target: "m", FairnessID: "f"}
	m.RequestReceived(l, 100)
	m.Running(l, 1)
	for _, v := range []*prometheus.HistogramVec{m.respSize, m.duration, m.ttftLLMD, m.tpotLLMD, m.gieTPOT, m.itlLLMD} {
		if n := testutil.CollectAndCount(v); n != 0 {
			t.Fatalf("%d response series before any response", n)
		}
	}
	t0 := time.Unix(100, 0)
	m.ResponseComplete(l, Response{Received: t0, FirstChunk: t0.Add(time.Second), Done: t0.Add(2 * time.Second),
		Usage: openai.Usage{PromptTokens: 10, CompletionTokens: 5}, UsageFound: true})
	if n := testutil.CollectAndCount(m.ttftLLMD); n != 1 {
		t.Fatalf("%d TTFT series after one non-streaming response, want 1", n)
	}
	if n := testutil.CollectAndCount(m.tpotLLMD) + testutil.CollectAndCount(m.gieTPOT); n != 0 {
		t.Fatalf("%d TPOT series after a non-streaming response", n)
	}
	m.ResponseComplete(l, Response{Received: t0, FirstChunk: t0.Add(time.Second), Done: t0.Add(2 * time.Second), Streaming: true,
		Usage: openai.Usage{PromptTokens: 10, CompletionTokens: 5}, UsageFound: true})
	if n := testutil.CollectAndCount(m.ttftLLMD); n != 2 {
		t.Fatalf("%d TTFT series after a streaming response too, want 2", n)
	}
	if n := testutil.CollectAndCount(m.tpotLLMD); n != 1 {
		t.Fatalf("%d TPOT series after a streaming response, want 1", n)
	}
}

// The per-request metric calls of a known label set allocate nothing.
func TestRequestMetricsDoNotAllocate(t *testing.T) {
	m := New(prometheus.NewRegistry())
	l := Labels{Model: "m", Target: "m", FairnessID: "f", Priority: 1}
	t0 := time.Unix(100, 0)
	r := Response{Received: t0, FirstChunk: t0.Add(time.Second), Done: t0.Add(2 * time.Second), Streaming: true,
		Usage: openai.Usage{PromptTokens: 10, CompletionTokens: 5}, UsageFound: true}
	request := func() {
		m.RequestReceived(l, 100)
		m.Running(l, 1)
		m.ITL(l, time.Millisecond)
		m.ResponseComplete(l, r)
		m.Running(l, -1)
	}
	request()
	if n := testing.AllocsPerRun(100, request); n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
}

// BenchmarkRequestMetrics is one request's metric calls on a known label set.
func BenchmarkRequestMetrics(b *testing.B) {
	m := New(prometheus.NewRegistry())
	l := Labels{Model: "m", Target: "m", FairnessID: "f", Priority: 1}
	t0 := time.Unix(100, 0)
	r := Response{Received: t0, FirstChunk: t0.Add(time.Second), Done: t0.Add(2 * time.Second), Streaming: true,
		Usage: openai.Usage{PromptTokens: 10, CompletionTokens: 5}, UsageFound: true}
	b.ReportAllocs()
	for b.Loop() {
		m.RequestReceived(l, 100)
		m.Running(l, 1)
		m.ITL(l, time.Millisecond)
		m.ResponseComplete(l, r)
		m.Running(l, -1)
	}
}
