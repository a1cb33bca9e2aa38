package flowcontrol_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/flowcontrol"
)

// gauge is the llm-d-prefixed gauge name's value in the series whose label
// is value.
func gauge(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != flowcontrol.PrefixLLMD+name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

// recordedSetup is newSetup's controller with its metrics on reg.
func recordedSetup(t *testing.T) (*setup, *flowcontrol.Controller, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec, err := flowcontrol.NewMetrics(reg, "pool")
	if err != nil {
		t.Fatal(err)
	}
	var cfg flowcontrol.Config
	s := newSetup(t, func(c *flowcontrol.Config) { cfg = *c })
	c, err := flowcontrol.New(cfg, flowcontrol.Options{Pool: s.pool, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	return s, c, reg
}

// The exported pool saturation follows releases: a Next with nothing
// queued re-measures, so the gauge does not stay at the level of the last
// dispatch (the async processor's picker-saturation gate reads it).
func TestSaturationGaugeFollowsReleases(t *testing.T) {
	s, c, reg := recordedSetup(t)
	effective := func() float64 { return gauge(t, reg, "flow_control_pool_saturation", "stage", "effective") }
	s.sat.set(0.9)
	if _, err := c.Enqueue(flowcontrol.Request{ID: "a", Bytes: 1, ReceivedAt: t0}, t0); err != nil {
		t.Fatal(err)
	}
	if it := c.Next(t0); it == nil {
		t.Fatal("not dispatched")
	}
	if got := effective(); got != 0.9 {
		t.Fatalf("gauge %v at dispatch, want 0.9", got)
	}
	// The request ends; the next wake-up finds the queue empty.
	s.sat.set(0.1)
	if it := c.Next(t0); it != nil {
		t.Fatal("dispatched from an empty queue")
	}
	if got := effective(); got != 0.1 {
		t.Fatalf("gauge %v after the release, want 0.1", got)
	}
}

// A band's capacity utilization follows its queue down to empty, however
// the queue emptied: its last dispatch, or clients that went away while
// the pool was saturated. Measured only while requests were queued, it
// stayed at the last non-empty queue's value.
func TestCapacityUtilizationFollowsTheQueue(t *testing.T) {
	tests := []struct {
		name  string
		empty func(*testing.T, *setup, *flowcontrol.Controller, []*flowcontrol.Item)
	}{
		{"dispatched", func(t *testing.T, s *setup, c *flowcontrol.Controller, _ []*flowcontrol.Item) {
			s.sat.set(0)
			for c.Next(t0) != nil {
			}
		}},
		{"cancelled", func(t *testing.T, _ *setup, c *flowcontrol.Controller, its []*flowcontrol.Item) {
			for _, it := range its {
				c.Cancel(it, t0)
			}
			if c.Next(t0) != nil {
				t.Fatal("dispatched from an empty queue")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c, reg := recordedSetup(t)
			utilization := func() float64 {
				return gauge(t, reg, "flow_control_capacity_utilization_requests", "priority", "0")
			}
			s.sat.set(1)
			var its []*flowcontrol.Item
			for range 50 {
				it, err := c.Enqueue(flowcontrol.Request{Bytes: 1, ReceivedAt: t0}, t0)
				if err != nil {
					t.Fatal(err)
				}
				its = append(its, it)
			}
			if c.Next(t0.Add(time.Millisecond)) != nil {
				t.Fatal("dispatched while saturated")
			}
			if got, want := utilization(), 50.0/flowcontrol.DefaultBandMaxRequests; got != want {
				t.Fatalf("utilization %v while 50 are queued, want %v", got, want)
			}
			tt.empty(t, s, c, its)
			if got := utilization(); got != 0 {
				t.Fatalf("utilization %v with the queue empty, want 0", got)
			}
		})
	}
}
