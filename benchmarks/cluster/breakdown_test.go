package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/sim/engine"
)

// TestTTFTBreakdown checks that the parts of every served request's TTFT
// add up to it, that they blame sheddable requests only when there are
// some, and that priority scheduling moves online prompts ahead of a
// batch backlog in the engine's own queue.
func TestTTFTBreakdown(t *testing.T) {
	plain := Policy{Name: "queue", Config: []byte("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n")}
	// 60 batch prompts of 1,000 tokens need 8 steps of 8,192 tokens; the
	// online ones arrive behind them, after the first step started.
	var backlog []workload.Request
	for i := range 60 {
		backlog = append(backlog, workload.Request{Segments: []workload.Segment{{Key: uint64(1000 + i), Len: 1000}}, OutputTokens: 30, Objective: workload.ObjectiveBatch})
	}
	online := func(reqs []workload.Request) []workload.Request {
		for i := range 4 {
			reqs = append(reqs, workload.Request{Arrival: time.Millisecond, Segments: []workload.Segment{{Key: uint64(i), Len: 200}}, OutputTokens: 10, Objective: workload.ObjectiveOnline})
		}
		return reqs
	}
	type sums struct{ wait, decode, prefill time.Duration }
	tests := []struct {
		name   string
		policy engine.SchedulingPolicy
		reqs   []workload.Request
		check  func(t *testing.T, on sums)
	}{
		{"online alone", engine.SchedulingFCFS, online(nil), func(t *testing.T, on sums) {
			if on.decode != 0 || on.prefill != 0 {
				t.Errorf("inflation %+v with no sheddable request", on)
			}
		}},
		{"behind a batch backlog, fcfs", engine.SchedulingFCFS, online(backlog), func(t *testing.T, on sums) {
			if on.prefill == 0 || on.wait < 4*5*time.Millisecond {
				t.Errorf("online behind the backlog: %+v", on)
			}
		}},
		{"behind a batch backlog, priority", engine.SchedulingPriority, online(backlog), func(t *testing.T, on sums) {
			if on.decode+on.prefill == 0 {
				t.Errorf("online beside batch work, no inflation: %+v", on)
			}
		}},
	}
	waits := map[engine.SchedulingPolicy]time.Duration{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := smallOpts(t)
			opts.Replicas, opts.SchedulingPolicy = 1, tc.policy
			opts.Objectives = map[string]int{workload.ObjectiveOnline: 100, workload.ObjectiveBatch: -1}
			res, err := Run(context.Background(), opts, plain, tc.reqs)
			if err != nil {
				t.Fatal(err)
			}
			var on sums
			for _, r := range res.Requests {
				if r.Err != "" {
					t.Fatalf("%s failed: %s", r.Objective, r.Err)
				}
				b := r.Breakdown
				if got := r.Queued + b.EngineWait + b.Prefill; got != r.TTFT {
					t.Errorf("%s: parts %v + %v + %v = %v, TTFT %v", r.Objective, r.Queued, b.EngineWait, b.Prefill, got, r.TTFT)
				}
				if b.InFlight > b.EngineWait || b.InFlightInflation > b.InFlight || b.DecodeInflation+b.PrefillInflation > b.Prefill {
					t.Errorf("%s: a part exceeds its whole: %+v", r.Objective, b)
				}
				if r.Objective == workload.ObjectiveOnline {
					on.wait += b.EngineWait
					on.decode += b.DecodeInflation
					on.prefill += b.PrefillInflation
				}
			}
			tc.check(t, on)
			if len(tc.reqs) > 4 {
				waits[tc.policy] = on.wait
			}
		})
	}
	if f, p := waits[engine.SchedulingFCFS], waits[engine.SchedulingPriority]; p*2 > f {
		t.Errorf("online engine wait %v under priority, %v under fcfs: priority did not move it ahead", p, f)
	}
}
