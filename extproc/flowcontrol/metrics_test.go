package flowcontrol

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

func histogram(t *testing.T, o prometheus.Observer) (count uint64, sum float64) {
	t.Helper()
	var pb dto.Metric
	if err := o.(prometheus.Metric).Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetHistogram().GetSampleCount(), pb.GetHistogram().GetSampleSum()
}

// The recorder writes each label set's series, under both prefixes, the
// same way on every call: the first and later writes (cached series) add
// up, and a stage removed and set again is exported again.
func TestMetricsSeries(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry(), "pool")
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{FairnessID: "tenant", Priority: -2, Model: "m", TargetModel: "t"}
	m.Queued(req, 1, 100)
	m.Queued(req, 1, 50)
	m.Queued(&Request{FairnessID: "other", Priority: -2, Model: "m", TargetModel: "t"}, 1, 7)
	m.Queued(req, -1, -100)
	m.Finished(req, Dispatched, 2*time.Second)
	m.Finished(req, Dispatched, time.Second)
	m.Finished(req, EvictedTTL, time.Second)
	for range 2 {
		m.EnqueueDuration(FlowKey{FairnessID: "tenant", Priority: -2}, Dispatched, time.Millisecond)
	}
	m.DispatchCycle(time.Millisecond)
	m.BandUtilization(-2, 0.25, 0.5)
	m.BandUtilization(-2, 0.5, 0.75)
	m.StaleEndpoints("utilization-detector", 3)
	m.StaleEndpoints("utilization-detector", 1)
	m.PoolSaturation("prefill", 0.5, true)
	m.PoolSaturation("prefill", 0, false)
	m.PoolSaturation("decode", 0.9, true)

	for i, p := range []string{PrefixLLMD, PrefixGIE} {
		for _, c := range []struct {
			name      string
			got, want float64
		}{
			{"queue size", testutil.ToFloat64(m.queueSize[i].WithLabelValues("tenant", "-2", "pool", "m", "t")), 1},
			{"queue bytes", testutil.ToFloat64(m.queueBytes[i].WithLabelValues("tenant", "-2", "pool", "m", "t")), 50},
			{"other flow's queue", testutil.ToFloat64(m.queueSize[i].WithLabelValues("other", "-2", "pool", "m", "t")), 1},
			{"dispatched", testutil.ToFloat64(m.requests[i].WithLabelValues("Dispatched", "-2", "pool")), 2},
			{"evicted", testutil.ToFloat64(m.requests[i].WithLabelValues("EvictedTTL", "-2", "pool")), 1},
			{"band requests", testutil.ToFloat64(m.capReq[i].WithLabelValues("-2", "pool")), 0.5},
			{"band bytes", testutil.ToFloat64(m.capBytes[i].WithLabelValues("-2", "pool")), 0.75},
			{"decode saturation", testutil.ToFloat64(m.saturation[i].WithLabelValues("pool", "decode")), 0.9},
			{"stages exported", float64(testutil.CollectAndCount(m.saturation[i])), 1},
		} {
			if c.got != c.want {
				t.Errorf("%s%s = %v, want %v", p, c.name, c.got, c.want)
			}
		}
		if n, sum := histogram(t, m.queueDuration[i].WithLabelValues("tenant", "-2", "Dispatched", "pool", "m", "t")); n != 2 || sum != 3 {
			t.Errorf("%s queue duration: %d observations, sum %v", p, n, sum)
		}
		if n, _ := histogram(t, m.enqueueDuration[i].WithLabelValues("tenant", "-2", "Dispatched")); n != 2 {
			t.Errorf("%s enqueue duration: %d observations", p, n)
		}
		if n, _ := histogram(t, m.dispatchCycle[i].WithLabelValues()); n != 1 {
			t.Errorf("%s dispatch cycle: %d observations", p, n)
		}
	}
	if got := testutil.ToFloat64(m.stale.WithLabelValues("utilization-detector")); got != 1 {
		t.Errorf("stale endpoints %v, want 1", got)
	}

	// A stage set again after its removal is exported again.
	m.PoolSaturation("prefill", 0.7, true)
	for i, p := range []string{PrefixLLMD, PrefixGIE} {
		if n := testutil.CollectAndCount(m.saturation[i]); n != 2 {
			t.Errorf("%s: %d stages exported after prefill was set again, want 2", p, n)
		}
	}
}
