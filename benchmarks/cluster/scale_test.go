package cluster

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/benchmarks/workload"
)

// script is a Scaler that sets replica counts at given times and records
// what it saw.
type script struct {
	at     []time.Duration
	want   []int
	states []FleetState
}

func (s *script) Scale(st FleetState) (int, error) {
	s.states = append(s.states, st)
	n := st.Replicas
	for i, at := range s.at {
		if st.Now >= at {
			n = s.want[i]
		}
	}
	return n, nil
}

var loadPolicy = Policy{Name: "load", Config: []byte(head + `plugins:
- type: queue-scorer
- type: max-score-picker
`)}

// TestScalingLifecycle grows a fleet from 1 to 3 replicas and back: new
// replicas serve only after the start-up delay, removed ones finish what
// they hold, every request completes, and GPU time counts each replica
// from its creation to its removal.
func TestScalingLifecycle(t *testing.T) {
	sp := workload.SharedPrefix{Groups: 1, SuffixTokens: 500, OutputTokens: 40,
		Stages: []workload.Stage{{QPS: 20, Duration: 3 * time.Minute}}}
	reqs, err := sp.Generate(1)
	if err != nil {
		t.Fatal(err)
	}
	sc := &script{at: []time.Duration{30 * time.Second, 120 * time.Second}, want: []int{3, 1}}
	o := smallOpts(t)
	o.Replicas = 1
	o.Scaling = Scaling{Scaler: sc, StartupDelay: 20 * time.Second}
	res, err := Run(context.Background(), o, loadPolicy, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res.Requests {
		if r.Err != "" {
			t.Fatalf("request %d failed: %s", i, r.Err)
		}
		// Replicas 1 and 2 are created at 30 s and serve from 50 s.
		if r.Replica > 0 && r.Arrival < 50*time.Second {
			t.Fatalf("request %d (arrival %v) routed to replica %d before it was ready", i, r.Arrival, r.Replica)
		}
		if r.Replica > 0 && r.Arrival > 121*time.Second {
			t.Fatalf("request %d (arrival %v) routed to replica %d after its removal", i, r.Arrival, r.Replica)
		}
	}
	got := res.Scaling.Events
	if len(got) != 2 || got[0] != (ScaleEvent{30 * time.Second, 1, 3}) || got[1] != (ScaleEvent{120 * time.Second, 3, 1}) {
		t.Fatalf("events %+v", got)
	}
	var readyAt time.Duration
	for _, p := range res.Scaling.Timeline {
		if p.Ready == 3 && readyAt == 0 {
			readyAt = p.At
		}
	}
	if readyAt != 50*time.Second {
		t.Errorf("three ready at %v, want 50s; timeline %+v", readyAt, res.Scaling.Timeline)
	}
	// GPU time: replica 0 the whole run; the two others from 30 s to when
	// their last request ended after 120 s (they drain in well under a
	// second at this load).
	lo := res.End.Seconds() + 2*90
	if res.GPUSeconds < lo || res.GPUSeconds > lo+2*5 {
		t.Errorf("GPU seconds %.1f, want about %.1f", res.GPUSeconds, lo)
	}
	// The scaler saw the serving fleet's signals.
	var sawRunning, sawGPU bool
	for _, st := range sc.states {
		if st.Ready > st.Replicas || (st.Now > 50*time.Second && st.Now < 120*time.Second && st.Ready != 3) {
			t.Errorf("at %v: %d ready of %d", st.Now, st.Ready, st.Replicas)
		}
		sawRunning = sawRunning || st.Running > 0
		sawGPU = sawGPU || (st.GPUUtil > 0 && st.GPUUtil <= float64(st.Ready)+1e-9)
		if math.IsNaN(st.PoolSaturation) || len(st.Finished) == 0 && st.Now > 30*time.Second {
			t.Errorf("at %v: saturation %v, %d finished", st.Now, st.PoolSaturation, len(st.Finished))
		}
	}
	if !sawRunning || !sawGPU {
		t.Errorf("signals never showed load: running %v, GPU %v", sawRunning, sawGPU)
	}
}

func TestFixedFleetGPUSeconds(t *testing.T) {
	res, err := Run(context.Background(), smallOpts(t), loadPolicy, repeated())
	if err != nil {
		t.Fatal(err)
	}
	if want := 4 * res.End.Seconds(); math.Abs(res.GPUSeconds-want) > 1e-9 {
		t.Errorf("GPU seconds %v, want %v", res.GPUSeconds, want)
	}
}

func TestScalingValidate(t *testing.T) {
	o := smallOpts(t)
	o.Scaling = Scaling{Scaler: &script{}, StartupDelay: -time.Second}
	if err := o.Validate(); err == nil {
		t.Error("negative start-up delay accepted")
	}
	o.Scaling = Scaling{Scaler: &script{}, MaxReplicas: MaxReplicas + 1}
	if err := o.Validate(); err == nil {
		t.Error("max replicas over the bound accepted")
	}
	o.Scaling = Scaling{Scaler: &script{}}
	o.Roles = []string{"prefill", "decode", "decode", "decode"}
	if err := o.Validate(); err == nil {
		t.Error("scaling a P/D fleet accepted")
	}
}
