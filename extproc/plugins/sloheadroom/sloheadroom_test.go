package sloheadroom

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// seeded builds the filter with a fixed random source, so that exploration
// is reproducible.
func seeded(t *testing.T, params string) *Filter {
	t.Helper()
	var raw []byte
	if params != "" {
		raw = []byte(params)
	}
	p, err := New("", raw, &scheduling.Handle{Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Filter)
}

func TestFilter(t *testing.T) {
	eps := []*endpoints.Endpoint{
		schedtest.Endpoint("fast", endpoints.Metrics{}),
		schedtest.Endpoint("slow", endpoints.Metrics{}),
		schedtest.Endpoint("ok", endpoints.Metrics{}),
		schedtest.Endpoint("slower", endpoints.Metrics{}),
	}
	// Quantiles against a 1s TTFT SLO: fast and ok meet it.
	est := []latency.Estimate{
		{TTFT: ms(100), TTFTQuantile: ms(200), TPOT: ms(10), TPOTQuantile: ms(20)},
		{TTFT: ms(900), TTFTQuantile: ms(1500), TPOT: ms(10), TPOTQuantile: ms(20)},
		{TTFT: ms(600), TTFTQuantile: ms(950), TPOT: ms(30), TPOTQuantile: ms(60)},
		{TTFT: ms(2000), TTFTQuantile: ms(3000), TPOT: ms(10), TPOTQuantile: ms(20)},
	}
	allMiss := []latency.Estimate{{TTFTQuantile: ms(1100)}, {TTFTQuantile: ms(1500)}, {TTFTQuantile: ms(2000)}, {TTFTQuantile: ms(3000)}}
	allMeet := []latency.Estimate{{TTFTQuantile: ms(100)}, {TTFTQuantile: ms(200)}, {TTFTQuantile: ms(300)}, {TTFTQuantile: ms(999)}}
	sub := []*endpoints.Endpoint{eps[1], eps[2], eps[3]}
	tests := []struct {
		name   string
		params string
		req    scheduling.Request
		est    []latency.Estimate // nil: no predictions in the cycle state
		buffer float64
		in     []*endpoints.Endpoint
		want   []string
	}{
		{"no SLO", `{"epsilonExploreNeg": 0}`, scheduling.Request{}, est, 0, eps, []string{"fast", "slow", "ok", "slower"}},
		{"no predictions", `{"epsilonExploreNeg": 0}`, scheduling.Request{TTFTSLO: time.Second}, nil, 0, eps, []string{"fast", "slow", "ok", "slower"}},
		{"meeting tier", `{"epsilonExploreNeg": 0}`, scheduling.Request{TTFTSLO: time.Second}, est, 0, eps, []string{"fast", "ok"}},
		{"meeting tier of a subset", `{"epsilonExploreNeg": 0}`, scheduling.Request{TTFTSLO: time.Second}, est, 0, sub, []string{"ok"}},
		// ok's TPOT quantile (60ms) misses a 50ms TPOT SLO.
		{"every objective must be met", `{"epsilonExploreNeg": 0}`, scheduling.Request{TTFTSLO: time.Second, TPOTSLO: ms(50)}, est, 0, eps, []string{"fast"}},
		{"tpot SLO alone", `{"epsilonExploreNeg": 0}`, scheduling.Request{TPOTSLO: ms(50)}, est, 0, eps, []string{"fast", "slow", "slower"}},
		// Doubling ok's 950ms quantile takes it past the SLO.
		{"buffer factor", `{"epsilonExploreNeg": 0}`, scheduling.Request{TTFTSLO: time.Second}, est, 2, eps, []string{"fast"}},
		{"none meet", `{"epsilonExploreNeg": 0}`, scheduling.Request{TTFTSLO: time.Second}, allMiss, 0, eps, []string{"fast", "slow", "ok", "slower"}},
		{"all meet", `{"epsilonExploreNeg": 0}`, scheduling.Request{TTFTSLO: time.Second}, allMeet, 0, eps, []string{"fast", "slow", "ok", "slower"}},
		{"explore the missing tier", `{"epsilonExploreNeg": 1}`, scheduling.Request{TTFTSLO: time.Second}, est, 0, eps, []string{"slow", "slower"}},
		// With nothing missing there is nothing to explore.
		{"explore with all meeting", `{"epsilonExploreNeg": 1}`, scheduling.Request{TTFTSLO: time.Second}, allMeet, 0, eps, []string{"fast", "slow", "ok", "slower"}},
		{"explore with none meeting", `{"epsilonExploreNeg": 1}`, scheduling.Request{TTFTSLO: time.Second}, allMiss, 0, eps, []string{"fast", "slow", "ok", "slower"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := scheduling.NewCycleState()
			if tc.est != nil {
				p := &latency.Predictions{BufferFactor: tc.buffer}
				p.Reset(eps)
				copy(p.Estimates, tc.est)
				scheduling.Write(cs, latency.PredictionsKey, p)
			}
			in := slices.Clone(tc.in)
			got := schedtest.Names(seeded(t, tc.params).Filter(context.Background(), cs, &tc.req, in))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
		})
	}
}

func TestExplorationRate(t *testing.T) {
	eps := []*endpoints.Endpoint{schedtest.Endpoint("meets", endpoints.Metrics{}), schedtest.Endpoint("misses", endpoints.Metrics{})}
	p := &latency.Predictions{}
	p.Reset(eps)
	p.Estimates[0].TTFTQuantile = ms(100)
	p.Estimates[1].TTFTQuantile = ms(5000)
	cs := scheduling.NewCycleState()
	scheduling.Write(cs, latency.PredictionsKey, p)
	req := &scheduling.Request{TTFTSLO: time.Second}
	tests := []struct {
		params   string
		min, max int // explorations out of 2000: a band wide enough for any seed
	}{
		{"", 5, 45}, // the 0.01 default: 20 expected
		{`{"epsilonExploreNeg": 0}`, 0, 0},
		{`{"epsilonExploreNeg": 0.25}`, 400, 600},
	}
	for _, tc := range tests {
		f := seeded(t, tc.params)
		explored := 0
		for range 2000 {
			if got := f.Filter(context.Background(), cs, req, slices.Clone(eps)); len(got) == 1 && got[0] == eps[1] {
				explored++
			}
		}
		if explored < tc.min || explored > tc.max {
			t.Errorf("%s: explored %d of 2000, want %d..%d", tc.params, explored, tc.min, tc.max)
		}
	}
}

func TestParams(t *testing.T) {
	for _, good := range []string{"", "{}", `{"epsilonExploreNeg": 0}`, `{"epsilonExploreNeg": 1}`, `{"epsilonExploreNeg": 0.5}`} {
		if _, err := schedtest.Build[*Filter](New, good); err != nil {
			t.Errorf("%s refused: %v", good, err)
		}
	}
	for _, bad := range []string{`{"epsilonExploreNeg": -0.01}`, `{"epsilonExploreNeg": 1.01}`, `{"epsilonExplore": 0.1}`, `{"epsilonExploreNeg": "often"}`} {
		if _, err := New("", []byte(bad), &scheduling.Handle{}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
