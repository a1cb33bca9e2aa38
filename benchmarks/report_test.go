package benchmarks

import (
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/benchmarks/cluster"
)

func TestSummarize(t *testing.T) {
	s := time.Second
	res := &cluster.Result{
		MaxQueueImbalance: 3,
		End:               10 * s,
		Requests: []cluster.RequestResult{
			// Stage at 1 QPS: arrivals 0–1 s; stage at 2 QPS from 4 s.
			{Arrival: 0, TTFT: 1 * s, E2E: 3 * s, TPOT: 200 * time.Millisecond, PromptTokens: 100, CachedTokens: 0, OutputTokens: 11, OfferedQPS: 1},
			{Arrival: 1 * s, TTFT: 2 * s, E2E: 5 * s, PromptTokens: 100, CachedTokens: 50, OutputTokens: 1, OfferedQPS: 1},
			{Arrival: 4 * s, TTFT: 3 * s, E2E: 6 * s, TPOT: 100 * time.Millisecond, PromptTokens: 200, CachedTokens: 150, OutputTokens: 31, OfferedQPS: 2},
			{Arrival: 5 * s, Err: "refused", OfferedQPS: 2},
		},
	}
	got := Summarize("p", 1, res)
	near := func(name string, a, b float64) {
		t.Helper()
		if math.Abs(a-b) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, a, b)
		}
	}
	if got.Requests != 3 || got.Failed != 1 || got.MaxQueueImbalance != 3 {
		t.Fatalf("counts: %+v", got)
	}
	near("p50", got.TTFTP50, 2)
	near("p90", got.TTFTP90, 3)
	near("p99", got.TTFTP99, 3)
	near("mean", got.TTFTMean, 2)
	// TPOT of the requests with more than one token: 2/10 and 3/30 s.
	near("tpot p50", got.TPOTP50, 0.1)
	near("hit", got.PrefixHitRatio, 200.0/400)
	near("throughput", got.ThroughputOutputTokS, 43.0/10)
	near("offered", got.OfferedQPS, 3.0/5)
	if len(got.Stages) != 2 {
		t.Fatalf("stages %+v", got.Stages)
	}
	// Stage 1's window is [0 s, 4 s): only the first request finishes in
	// it (3 s). Stage 2's is [4 s, 5 s), up to the last arrival: the others
	// finish later (6 s, 10 s), during the drain, which no stage counts.
	near("stage 1 throughput", got.Stages[0].ThroughputOutputTokS, 11.0/4)
	near("stage 2 throughput", got.Stages[1].ThroughputOutputTokS, 0)
	near("stage 2 p90", got.Stages[1].TTFTP90, 3)
}

func TestPercentileNearestRank(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[float64]float64{0: 1, 10: 1, 50: 5, 90: 9, 91: 10, 100: 10} {
		if got := pct(v, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if pct(nil, 50) != 0 {
		t.Error("empty")
	}
}
