package flowcontrol_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/extproc/flowcontrol"
)

// series finds the sample of family name whose labels include want.
func series(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (*dto.Metric, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue next
				}
			}
			return m, true
		}
	}
	return nil, false
}

// The recorder writes each label set's series, under both prefixes, the
// same way on every call: the first and later writes (cached series) add
// up, and a stage removed and set again is exported again.
func TestMetricsSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := flowcontrol.NewMetrics(reg, "pool")
	if err != nil {
		t.Fatal(err)
	}
	req := &flowcontrol.Request{FairnessID: "tenant", Priority: -2, Model: "m", TargetModel: "t"}
	other := &flowcontrol.Request{FairnessID: "other-tenant", Priority: -2, Model: "m", TargetModel: "t"}
	m.Queued(req, 1, 100)
	m.Queued(req, 1, 50)
	m.Queued(other, 1, 7)
	m.Queued(req, -1, -100)
	m.Finished(req, flowcontrol.Dispatched, 2*time.Second)
	m.Finished(req, flowcontrol.Dispatched, time.Second)
	m.Finished(req, flowcontrol.EvictedTTL, time.Second)
	m.EnqueueDuration(flowcontrol.FlowKey{FairnessID: "tenant", Priority: -2}, flowcontrol.Dispatched, time.Millisecond)
	m.EnqueueDuration(flowcontrol.FlowKey{FairnessID: "tenant", Priority: -2}, flowcontrol.Dispatched, time.Millisecond)
	m.DispatchCycle(time.Millisecond)
	m.BandUtilization(-2, 0.25, 0.5)
	m.BandUtilization(-2, 0.5, 0.75)
	m.StaleEndpoints("utilization-detector", 3)
	m.StaleEndpoints("utilization-detector", 1)
	m.PoolSaturation("prefill", 0.5, true)
	m.PoolSaturation("prefill", 0, false)
	m.PoolSaturation("decode", 0.9, true)

	queue := map[string]string{"fairness_id": "tenant", "priority": "-2", "inference_pool": "pool", "model_name": "m", "target_model_name": "t"}
	dispatched := map[string]string{"fairness_id": "tenant", "priority": "-2", "outcome": "Dispatched"}
	for _, p := range []string{flowcontrol.PrefixLLMD, flowcontrol.PrefixGIE} {
		checks := []struct {
			name   string
			labels map[string]string
			value  func(*dto.Metric) float64
			want   float64
		}{
			{"flow_control_queue_size", queue, gauge, 1},
			{"flow_control_queue_bytes", queue, gauge, 50},
			{"flow_control_queue_size", map[string]string{"fairness_id": "other-tenant"}, gauge, 1},
			{"flow_control_requests_total", map[string]string{"outcome": "Dispatched", "priority": "-2", "inference_pool": "pool"}, counter, 2},
			{"flow_control_requests_total", map[string]string{"outcome": "EvictedTTL"}, counter, 1},
			{"flow_control_request_queue_duration_seconds", dispatched, histSum, 3},
			{"flow_control_request_enqueue_duration_seconds", dispatched, histCount, 2},
			{"flow_control_dispatch_cycle_duration_seconds", nil, histCount, 1},
			{"flow_control_capacity_utilization_requests", map[string]string{"priority": "-2"}, gauge, 0.5},
			{"flow_control_capacity_utilization_bytes", map[string]string{"priority": "-2"}, gauge, 0.75},
			{"flow_control_pool_saturation", map[string]string{"stage": "decode"}, gauge, 0.9},
		}
		for _, c := range checks {
			s, ok := series(t, reg, p+c.name, c.labels)
			if !ok {
				t.Errorf("%s%s%v: no series", p, c.name, c.labels)
				continue
			}
			if got := c.value(s); got != c.want {
				t.Errorf("%s%s%v = %v, want %v", p, c.name, c.labels, got, c.want)
			}
		}
		if _, ok := series(t, reg, p+"flow_control_pool_saturation", map[string]string{"stage": "prefill"}); ok {
			t.Errorf("%s: a removed stage is still exported", p)
		}
	}
	if s, ok := series(t, reg, flowcontrol.PrefixLLMD+"flow_control_stale_endpoints", map[string]string{"detector": "utilization-detector"}); !ok || gauge(s) != 1 {
		t.Errorf("stale endpoints: %v", s)
	}

	// A stage set again after its removal is exported again.
	m.PoolSaturation("prefill", 0.7, true)
	for _, p := range []string{flowcontrol.PrefixLLMD, flowcontrol.PrefixGIE} {
		if s, ok := series(t, reg, p+"flow_control_pool_saturation", map[string]string{"stage": "prefill"}); !ok || gauge(s) != 0.7 {
			t.Errorf("%s: prefill stage set again: %v", p, s)
		}
	}
}

func gauge(m *dto.Metric) float64     { return m.GetGauge().GetValue() }
func counter(m *dto.Metric) float64   { return m.GetCounter().GetValue() }
func histSum(m *dto.Metric) float64   { return m.GetHistogram().GetSampleSum() }
func histCount(m *dto.Metric) float64 { return float64(m.GetHistogram().GetSampleCount()) }
