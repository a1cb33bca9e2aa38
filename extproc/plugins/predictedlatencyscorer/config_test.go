package predictedlatencyscorer_test

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// TestUpstreamGuide loads GIE v1.5's troubleshooting-guide configuration,
// whose only profile plugin is predicted-latency-scorer, and schedules
// requests without an SLO over an idle server and one with a long queue:
// the scorer predicts by itself (no producer is configured). Without an
// SLO both miss TTFT (the untrained model predicts no TPOT, so both meet
// that); GIE's deficit weights, blended 0.8 TTFT / 0.2 TPOT, are then 82
// for the idle server and 18 for the busy one.
func TestUpstreamGuide(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "testdata", "upstream",
		"gateway-api-inference-extension-v1-5-0-site-src-guides-troubleshooting-2.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	b, err := config.Build(c, all.Registry(), &scheduling.Handle{Rand: rand.New(rand.NewPCG(3, 5))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoints.Endpoint{
		schedtest.Endpoint("busy", endpoints.Metrics{WaitingQueueSize: 40, RunningRequests: 40, KVCacheUsage: 0.6}),
		schedtest.Endpoint("idle", endpoints.Metrics{KVCacheUsage: 0.1}),
	}
	const n = 2000
	idle := 0
	for i := range n {
		req := &scheduling.Request{ID: string(rune('a' + i%26)), TargetModel: "m", PromptTokens: 2000}
		res, err := b.Scheduler.Schedule(context.Background(), scheduling.NewCycleState(), req, eps)
		if err != nil {
			t.Fatal(err)
		}
		if res.Primary().Targets[0] == eps[1] {
			idle++
		}
	}
	if share := float64(idle) / n; math.Abs(share-0.82) > 0.04 {
		t.Errorf("%d of %d requests went to the idle server, want 82%%", idle, n)
	}
}
