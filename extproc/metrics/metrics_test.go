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
