package prefixaffinity

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/plugins/predictedlatency"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

func build(t *testing.T, params string) *Filter {
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

func fleet(n int) []*endpoints.Endpoint {
	eps := make([]*endpoints.Endpoint, n)
	for i := range eps {
		eps[i] = schedtest.Endpoint(string(rune('a'+i)), endpoints.Metrics{})
	}
	return eps
}

// cand is what the predicted-latency-producer says of one candidate.
type cand struct {
	held             float64
	prefill, backlog float64
	ttft             time.Duration
}

func predicted(eps []*endpoints.Endpoint, cands []cand) *scheduling.CycleState {
	p := &latency.Predictions{}
	p.Reset(eps)
	for i, c := range cands {
		p.Held[i] = c.held
		p.Features[i] = latency.Features{Prefill: c.prefill, Backlog: c.backlog}
		p.Estimates[i] = latency.Estimate{TTFT: c.ttft, TTFTQuantile: c.ttft}
	}
	cs := scheduling.NewCycleState()
	scheduling.Write(cs, latency.PredictionsKey, p)
	return cs
}

func TestFilterWithPredictions(t *testing.T) {
	eps := fleet(3)
	// a holds most of the prompt but has a backlog: by throughput
	// (1000 tokens/s) it needs 1.1s against b's 1s; the predictor instead
	// says 3s against 1s.
	overloaded := []cand{{held: 0.9, prefill: 100, backlog: 1000, ttft: ms(3000)}, {held: 0, prefill: 1000, ttft: ms(1000)}, {held: 0.5, prefill: 500, ttft: ms(1500)}}
	even := []cand{{held: 0.9, prefill: 100}, {held: 0.5, prefill: 500}, {held: 0.85, prefill: 150}}
	tests := []struct {
		name   string
		params string
		cands  []cand
		in     []*endpoints.Endpoint
		want   []string
	}{
		{"keeps the sticky ones", "", even, eps, []string{"a", "c"}},
		{"threshold is inclusive", `{"affinityThreshold": 0.5}`, even, eps, []string{"a", "b", "c"}},
		{"above every holder", `{"affinityThreshold": 0.95}`, even, eps, []string{"a", "b", "c"}},
		{"all sticky", `{"affinityThreshold": 0.4}`, even, eps, []string{"a", "b", "c"}},
		{"old threshold name", `{"affinityGateTau": 0.88}`, even, eps, []string{"a"}},
		// Holding nothing is never sticky, even at threshold 0.
		{"zero threshold needs a hit", `{"affinityThreshold": 0}`, []cand{{held: 0.1, prefill: 900}, {held: 0, prefill: 1000}, {held: 0, prefill: 1000}}, eps, []string{"a"}},
		{"subset", "", even, []*endpoints.Endpoint{eps[1], eps[2]}, []string{"c"}},
		{"single candidate", "", even, eps[1:2], []string{"b"}},
		{"throughput penalty within bound", `{"peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 200}`, overloaded, eps[:2], []string{"a"}},
		{"throughput penalty exceeded", `{"peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 50}`, overloaded, eps[:2], []string{"a", "b"}},
		// The predictor's 2s penalty decides, not the features' 0.1s.
		{"predictor penalty exceeded", `{"ttftSource": "latencyPredictor", "peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 1000}`, overloaded, eps[:2], []string{"a", "b"}},
		{"predictor penalty within bound", `{"ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 2500}`, overloaded, eps[:2], []string{"a"}},
		// The penalty is the fastest sticky candidate's (c, 1.5s) over the
		// fastest of all (b, 1s): a slow sticky one does not veto.
		{"best sticky within bound", `{"ttftSource": "latencyPredictor", "affinityThreshold": 0.5, "maxTTFTPenaltyMs": 600}`, overloaded, eps, []string{"a", "c"}},
		{"best sticky exceeds", `{"ttftSource": "latencyPredictor", "affinityThreshold": 0.5, "maxTTFTPenaltyMs": 400}`, overloaded, eps, []string{"a", "b", "c"}},
		{"default penalty is 18s", `{"ttftSource": "latencyPredictor"}`, []cand{{held: 1, ttft: 17 * time.Second}, {ttft: ms(100)}}, eps[:2], []string{"a"}},
		{"default penalty exceeded", `{"ttftSource": "latencyPredictor"}`, []cand{{held: 1, ttft: 19 * time.Second}, {ttft: ms(100)}}, eps[:2], []string{"a", "b"}},
		// The default 15928 tokens/s: 400100 tokens take 25s, over 18s.
		{"default throughput", "", []cand{{held: 0.9, prefill: 100, backlog: 400000}, {prefill: 1000}}, eps[:2], []string{"a", "b"}},
		{"exploration", `{"explorationProbability": 1}`, even, eps, []string{"a", "b", "c"}},
		{"old exploration name", `{"epsilonExploreSticky": 1}`, even, eps, []string{"a", "b", "c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.in)
			got := schedtest.Names(build(t, tc.params).Filter(context.Background(), predicted(eps, tc.cands), &scheduling.Request{PromptTokens: 1000}, in))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
			if !slices.Equal(in, tc.in) {
				t.Fatalf("filter rewrote its input: %v", schedtest.Names(in))
			}
		})
	}
}

func TestFilterWithPrefixMatch(t *testing.T) {
	const prompt = 1000
	tests := []struct {
		name    string
		params  string
		noMatch bool
		prompt  int
		held    []float64 // blocks of 10 tokens
		backlog []int64   // uncached tokens charged to each endpoint
		want    []string
	}{
		{"keeps the holder", "", false, prompt, []float64{90, 0, 50}, nil, []string{"a"}},
		{"no holder", "", false, prompt, []float64{10, 0, 50}, nil, []string{"a", "b", "c"}},
		// a's 100000-token backlog takes 100s at 1000 tokens/s.
		{"holder overloaded", `{"peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 1000}`, false, prompt, []float64{90, 0, 0}, []int64{100000, 0, 0}, []string{"a", "b", "c"}},
		{"holder busy within bound", `{"peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 1000}`, false, prompt, []float64{90, 0, 0}, []int64{500, 0, 0}, []string{"a"}},
		// Only the predictor knows the TTFT, and it did not run.
		{"predictor source without predictions", `{"ttftSource": "latencyPredictor"}`, false, prompt, []float64{90, 0, 0}, nil, []string{"a", "b", "c"}},
		{"no match", "", true, prompt, nil, nil, []string{"a", "b", "c"}},
		// The request's estimate is missing but the match counted the
		// prompt: its count is the one held tokens are measured against.
		{"prompt length from the match", "", false, 0, []float64{90, 0, 0}, nil, []string{"a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := fleet(3)
			cs := scheduling.NewCycleState()
			if !tc.noMatch {
				m := &prefixmatch.Prediction{BlockTokens: 10, PromptTokens: prompt}
				m.Reset(eps)
				for i, b := range tc.held {
					m.Matched(i, b)
				}
				scheduling.Write(cs, prefixmatch.MatchKey, m)
			}
			for i, n := range tc.backlog {
				if n > 0 {
					eps[i].Charge(0, n, n, n)
				}
			}
			got := schedtest.Names(build(t, tc.params).Filter(context.Background(), cs, &scheduling.Request{PromptTokens: tc.prompt}, eps))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
		})
	}
}

func TestExplorationRate(t *testing.T) {
	eps := fleet(2)
	cs := predicted(eps, []cand{{held: 1, prefill: 1}, {prefill: 1000}})
	f := build(t, `{"explorationProbability": 0.3}`)
	kept := 0
	for range 2000 {
		if len(f.Filter(context.Background(), cs, &scheduling.Request{PromptTokens: 1000}, slices.Clone(eps))) == 2 {
			kept++
		}
	}
	// 600 expected; the band is wide enough for any seed.
	if kept < 500 || kept > 700 {
		t.Fatalf("kept everyone %d times of 2000 at probability 0.3", kept)
	}
}

func TestParams(t *testing.T) {
	for _, good := range []string{"", "{}", `{"affinityThreshold": 0}`, `{"affinityThreshold": 1}`, `{"affinityGateTau": 0.5}`, `{"explorationProbability": 1}`, `{"epsilonExploreSticky": 0}`, `{"maxTTFTPenaltyMs": 0}`, `{"ttftSource": "latencyPredictor"}`, `{"ttftSource": "prefillThroughput"}`} {
		if _, err := schedtest.Build[*Filter](New, good); err != nil {
			t.Errorf("%s refused: %v", good, err)
		}
	}
	for _, bad := range []string{
		`{"affinityThreshold": 0.8, "affinityGateTau": 0.8}`,
		`{"explorationProbability": 0, "epsilonExploreSticky": 0}`,
		`{"affinityThreshold": -0.1}`,
		`{"affinityThreshold": 1.1}`,
		`{"affinityGateTau": 2}`,
		`{"explorationProbability": -0.1}`,
		`{"epsilonExploreSticky": 1.5}`,
		`{"maxTTFTPenaltyMs": -1}`,
		`{"maxTTFTPenaltyMs": 1e13}`, // past a time.Duration
		`{"ttftSource": "oracle"}`,
		`{"ttftSource": ""}`,
		`{"peakPrefillThroughput": 0}`,
		`{"peakPrefillThroughput": -5}`,
		`{"affinityTreshold": 0.8}`,
	} {
		if _, err := New("", []byte(bad), &scheduling.Handle{}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestWithProducer runs the filter on what the real producer leaves, so
// that both agree on what Held means (a share of the prompt, not tokens).
func TestWithProducer(t *testing.T) {
	eps := fleet(3)
	cs := scheduling.NewCycleState()
	m := &prefixmatch.Prediction{BlockTokens: 10, PromptTokens: 1000}
	m.Reset(eps)
	m.Matched(0, 90)
	m.Matched(1, 30)
	scheduling.Write(cs, prefixmatch.MatchKey, m)
	prod, err := schedtest.Build[scheduling.DataProducer](predictedlatency.New, "")
	if err != nil {
		t.Fatal(err)
	}
	req := &scheduling.Request{PromptTokens: 1000}
	prod.Produce(context.Background(), cs, req, eps)
	for _, params := range []string{"", `{"ttftSource": "latencyPredictor"}`} {
		if got := schedtest.Names(build(t, params).Filter(context.Background(), cs, req, slices.Clone(eps))); !slices.Equal(got, []string{"a"}) {
			t.Errorf("%s: kept %v, want the 90%% holder", params, got)
		}
	}
}

// A throughput TTFT past a time.Duration saturates instead of wrapping
// negative (which the filter would read as the best endpoint's).
func TestThroughputTTFTSaturates(t *testing.T) {
	f := &Filter{peak: 1e-9}
	if got := f.throughputTTFT(1e7); got != time.Duration(math.MaxInt64) {
		t.Fatalf("throughputTTFT = %v, want the largest duration", got)
	}
	f.peak = 1000
	if got := f.throughputTTFT(500); got != 500*time.Millisecond {
		t.Fatalf("throughputTTFT = %v, want 500ms", got)
	}
}
