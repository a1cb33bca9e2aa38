package flowcontrol_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/flowcontrol"
)

// The exported pool saturation follows releases: a Next with nothing
// queued re-measures, so the gauge does not stay at the level of the last
// dispatch (the async processor's picker-saturation gate reads it).
func TestSaturationGaugeFollowsReleases(t *testing.T) {
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
	gauge := func() float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != flowcontrol.PrefixLLMD+"flow_control_pool_saturation" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "stage" && l.GetValue() == "effective" {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		t.Fatal("no effective saturation")
		return 0
	}
	s.sat.set(0.9)
	if _, err := c.Enqueue(flowcontrol.Request{ID: "a", Bytes: 1, ReceivedAt: t0}, t0); err != nil {
		t.Fatal(err)
	}
	if it := c.Next(t0); it == nil {
		t.Fatal("not dispatched")
	}
	if got := gauge(); got != 0.9 {
		t.Fatalf("gauge %v at dispatch, want 0.9", got)
	}
	// The request ends; the next wake-up finds the queue empty.
	s.sat.set(0.1)
	if it := c.Next(t0); it != nil {
		t.Fatal("dispatched from an empty queue")
	}
	if got := gauge(); got != 0.1 {
		t.Fatalf("gauge %v after the release, want 0.1", got)
	}
}
