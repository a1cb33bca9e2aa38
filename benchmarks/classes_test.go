package benchmarks

import (
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/benchmarks/cluster"
)

// TestClassTTFTBreakdown checks the per-class averages of the TTFT parts:
// over every served request, and over those at or above the class's p90
// (nearest rank: the 9th of 10, 28 ms, and the 200 ms one).
func TestClassTTFTBreakdown(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	served := func(ttft, queue, wait, inFlight, decode int, preemptions int) cluster.RequestResult {
		return cluster.RequestResult{Objective: "online", Priority: 100, TTFT: ms(ttft), Queued: ms(queue), OutputTokens: 1,
			Breakdown: cluster.TTFTBreakdown{EngineWait: ms(wait), InFlight: ms(inFlight), Prefill: ms(ttft - queue - wait),
				DecodeInflation: ms(decode), Preemptions: preemptions}}
	}
	var reqs []cluster.RequestResult
	for i := range 9 {
		reqs = append(reqs, served(20+i, 0, 5, 5, 1, 0))
		reqs[i].Arrival = time.Duration(i) * time.Second
	}
	for i := range reqs {
		reqs[i].PromptTokens, reqs[i].CachedTokens = 100, 80
	}
	slow := served(200, 100, 60, 10, 4, 2)
	slow.Arrival = 9 * time.Second
	// The slow one's prefix was gone; the refused request's tokens do not
	// count.
	slow.PromptTokens = 100
	reqs = append(reqs, slow, cluster.RequestResult{Objective: "online", Priority: 100, Err: "refused", Arrival: 9 * time.Second, PromptTokens: 1000})
	cs := summarizeClasses(&cluster.Result{Requests: reqs})
	if len(cs) != 1 {
		t.Fatalf("%d classes", len(cs))
	}
	c := cs[0]
	tests := []struct {
		name      string
		got, want float64
	}{
		{"mean requests", float64(c.Mean.Requests), 10},
		{"mean TTFT", c.Mean.TTFT, (0.216 + 0.200) / 10},
		{"mean queue", c.Mean.Queue, 0.100 / 10},
		{"mean engine wait", c.Mean.EngineWait, (9*0.005 + 0.060) / 10},
		{"mean prefill", c.Mean.Prefill, (0.171 + 0.040) / 10},
		{"mean decode inflation", c.Mean.DecodeInflation, (9*0.001 + 0.004) / 10},
		{"tail requests", float64(c.Tail.Requests), 2},
		{"tail TTFT", c.Tail.TTFT, (0.028 + 0.200) / 2},
		{"tail in flight", c.Tail.InFlight, (0.005 + 0.010) / 2},
		{"preempted", float64(c.Preempted), 1},
		{"prefix hit", c.PrefixHit, 9 * 80.0 / 1000},
	}
	for _, tc := range tests {
		if math.Abs(tc.got-tc.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if p := c.Mean; math.Abs(p.Queue+p.EngineWait+p.Prefill-p.TTFT) > 1e-9 {
		t.Errorf("mean parts %+v do not add up to the mean TTFT", p)
	}
}
