package latencyscorer

import (
	"context"
	"math/rand/v2"
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

func fleet(names ...string) []*endpoints.Endpoint {
	eps := make([]*endpoints.Endpoint, len(names))
	for i, n := range names {
		eps[i] = schedtest.Endpoint(n, endpoints.Metrics{})
	}
	return eps
}

// withPredictions is the cycle state a predicted-latency-producer would
// leave, built by hand so that each case controls every estimate.
func withPredictions(eps []*endpoints.Endpoint, est ...latency.Estimate) *scheduling.CycleState {
	p := &latency.Predictions{}
	p.Reset(eps)
	copy(p.Estimates, est)
	cs := scheduling.NewCycleState()
	scheduling.Write(cs, latency.PredictionsKey, p)
	return cs
}

func build(t *testing.T, params string) *Scorer {
	t.Helper()
	s, err := schedtest.Build[*Scorer](New, params)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func score(s *Scorer, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) []float64 {
	out := make([]float64, len(eps))
	s.Score(context.Background(), cs, req, eps, out)
	return out
}

func TestScoreWithoutSLO(t *testing.T) {
	eps := fleet("a", "b", "c", "d")
	a, b, c, d := eps[0], eps[1], eps[2], eps[3]
	est := []latency.Estimate{
		{TTFT: ms(100), TPOT: ms(10)},
		{TTFT: ms(200), TPOT: ms(20)},
		{TTFT: ms(400), TPOT: ms(10)},
		{TTFT: ms(100), TPOT: ms(40)},
	}
	noTPOT := []latency.Estimate{{TTFT: ms(100)}, {TTFT: ms(200)}, {TTFT: ms(400)}, {TTFT: ms(50)}}
	imposed := []latency.Estimate{{TTFT: ms(100), Imposed: ms(100)}, {TTFT: ms(200)}, {TTFT: ms(400)}, {TTFT: ms(100)}}
	tests := []struct {
		name   string
		params string
		est    []latency.Estimate
		// scored is the filtered subset handed to Score; the predictions
		// cover all four endpoints.
		scored []*endpoints.Endpoint
		want   []float64
	}{
		{"default weights", "", est, eps, []float64{0.8 + 0.2, 0.8*0.5 + 0.2*0.5, 0.8*0.25 + 0.2, 0.8 + 0.2*0.25}},
		// A filter that kept everything hands over a copy of the list.
		{"unfiltered copy", "", est, append([]*endpoints.Endpoint(nil), eps...), []float64{0.8 + 0.2, 0.8*0.5 + 0.2*0.5, 0.8*0.25 + 0.2, 0.8 + 0.2*0.25}},
		{"ttft only", `{"ttftWeight": 1, "tpotWeight": 0}`, est, eps, []float64{1, 0.5, 0.25, 1}},
		{"tpot only", `{"ttftWeight": 0, "tpotWeight": 1}`, est, eps, []float64{1, 0.5, 1, 0.25}},
		{"weights are relative", `{"ttftWeight": 4, "tpotWeight": 1}`, est, eps, []float64{1, 0.5, 0.8*0.25 + 0.2, 0.8 + 0.2*0.25}},
		// The best of the subset, not of every prediction, scores 1: a
		// filtered-out fast endpoint must not depress the survivors.
		{"filtered subset", "", est, []*endpoints.Endpoint{b, c}, []float64{0.8 + 0.2*0.5, 0.8*0.5 + 0.2}},
		{"subset keeps pairing after a gap", `{"ttftWeight": 1, "tpotWeight": 0}`, est, []*endpoints.Endpoint{a, d}, []float64{1, 1}},
		// Prefill pods predict no TPOT: its weight must not cap the
		// scores below 1.
		{"no candidate predicts TPOT", "", noTPOT, []*endpoints.Endpoint{a, b, c}, []float64{1, 0.5, 0.25}},
		{"tpot-only weights and no TPOT", `{"ttftWeight": 0, "tpotWeight": 1}`, noTPOT, eps, []float64{0, 0, 0, 0}},
		// What a request adds to the TTFTs of requests queued there
		// counts as if it were its own: a is as fast as d for it but
		// delays a queued prompt by 100 ms.
		{"imposed delay counts", `{"ttftWeight": 1, "tpotWeight": 0}`, imposed, eps, []float64{0.5, 0.5, 0.25, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := score(build(t, tc.params), withPredictions(eps, tc.est...), &scheduling.Request{}, tc.scored)
			schedtest.ExpectScores(t, got, tc.want)
		})
	}
}

func TestScoreSkipsUnpredictedEndpoint(t *testing.T) {
	eps := fleet("a", "b")
	stranger := schedtest.Endpoint("stranger", endpoints.Metrics{})
	cs := withPredictions(eps, latency.Estimate{TTFT: ms(100)}, latency.Estimate{TTFT: ms(200)})
	got := score(build(t, `{"ttftWeight": 1, "tpotWeight": 0}`), cs, &scheduling.Request{}, []*endpoints.Endpoint{eps[0], stranger, eps[1]})
	schedtest.ExpectScores(t, got, []float64{1, 0, 0.5})
}

func TestScoreWithSLO(t *testing.T) {
	eps := fleet("roomy", "mid", "tight", "near-miss", "far-miss")
	// Headroom against a 1s TTFT SLO: 0.8, 0.5, 0.1, -0.5, -2.
	est := []latency.Estimate{
		{TTFT: ms(100), TTFTQuantile: ms(200)},
		{TTFT: ms(300), TTFTQuantile: ms(500)},
		{TTFT: ms(800), TTFTQuantile: ms(900)},
		{TTFT: ms(1000), TTFTQuantile: ms(1500)},
		{TTFT: ms(2000), TTFTQuantile: ms(3000)},
	}
	req := &scheduling.Request{TTFTSLO: time.Second}
	tests := []struct {
		params string
		// order is the indices of eps from the highest score down.
		order []int
	}{
		{"", []int{2, 1, 0, 3, 4}},
		{`{"headroomSelectionStrategy": "least"}`, []int{2, 1, 0, 3, 4}},
		{`{"headroomSelectionStrategy": "most"}`, []int{0, 1, 2, 3, 4}},
	}
	for _, tc := range tests {
		t.Run(tc.params, func(t *testing.T) {
			got := score(build(t, tc.params), withPredictions(eps, est...), req, eps)
			for i, sc := range got {
				meets := i < 3
				if meets && !(sc > 0.5 && sc <= 1) || !meets && !(sc >= 0 && sc < 0.5) {
					t.Fatalf("%s scored %v (meets SLO: %v); all %v", eps[i].Name(), sc, meets, got)
				}
			}
			for j := 1; j < len(tc.order); j++ {
				if hi, lo := tc.order[j-1], tc.order[j]; got[hi] <= got[lo] {
					t.Fatalf("%s (%v) should outscore %s (%v); all %v", eps[hi].Name(), got[hi], eps[lo].Name(), got[lo], got)
				}
			}
		})
	}
}

func TestScoreWithSLOTiersAndSubsets(t *testing.T) {
	eps := fleet("a", "b", "c")
	a, b, c := eps[0], eps[1], eps[2]
	tests := []struct {
		name   string
		params string
		req    scheduling.Request
		est    []latency.Estimate
		scored []*endpoints.Endpoint
		want   []float64
	}{
		// One candidate per tier sits at the top of its tier's range.
		{"lone meeting candidate, least", "", scheduling.Request{TTFTSLO: time.Second},
			[]latency.Estimate{{TTFTQuantile: ms(500)}, {TTFTQuantile: ms(2000)}, {}}, []*endpoints.Endpoint{a, b}, []float64{0.51, 0.49}},
		{"lone meeting candidate, most", `{"headroomSelectionStrategy": "most"}`, scheduling.Request{TTFTSLO: time.Second},
			[]latency.Estimate{{TTFTQuantile: ms(500)}, {TTFTQuantile: ms(2000)}, {}}, []*endpoints.Endpoint{a, b}, []float64{1, 0.49}},
		// The mean meets, the quantile does not: the cautious one counts.
		{"quantile decides", "", scheduling.Request{TTFTSLO: time.Second},
			[]latency.Estimate{{TTFT: ms(500), TTFTQuantile: ms(1200)}, {TTFT: ms(900), TTFTQuantile: ms(950)}, {}}, []*endpoints.Endpoint{a, b}, []float64{0.49, 0.51}},
		// a would meet but was filtered out: the survivors rank among
		// themselves.
		{"subset", "", scheduling.Request{TTFTSLO: time.Second},
			[]latency.Estimate{{TTFTQuantile: ms(100)}, {TTFTQuantile: ms(3000)}, {TTFTQuantile: ms(1500)}}, []*endpoints.Endpoint{b, c}, []float64{0, 0.49}},
		// A TPOT miss makes a candidate miss however good its TTFT.
		{"tpot miss", "", scheduling.Request{TTFTSLO: time.Second, TPOTSLO: ms(50)},
			[]latency.Estimate{{TTFTQuantile: ms(100), TPOT: ms(40), TPOTQuantile: ms(60)}, {TTFTQuantile: ms(900), TPOT: ms(20), TPOTQuantile: ms(30)}, {}}, []*endpoints.Endpoint{a, b}, []float64{0.49, 0.51}},
		// A candidate predicting no TPOT (a prefill pod) is judged by TTFT
		// alone.
		{"tpot unknown", "", scheduling.Request{TTFTSLO: time.Second, TPOTSLO: ms(50)},
			[]latency.Estimate{{TTFTQuantile: ms(100)}, {TTFTQuantile: ms(2000)}, {}}, []*endpoints.Endpoint{a, b}, []float64{0.51, 0.49}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := score(build(t, tc.params), withPredictions(eps, tc.est...), &tc.req, tc.scored)
			schedtest.ExpectScores(t, got, tc.want)
		})
	}
}

func TestScoreWithSLOExactRanks(t *testing.T) {
	eps := fleet("a", "b", "c")
	cs := withPredictions(eps, latency.Estimate{TTFTQuantile: ms(200)}, latency.Estimate{TTFTQuantile: ms(500)}, latency.Estimate{TTFTQuantile: ms(900)})
	// Headroom 0.8, 0.5, 0.1: b sits 3/7 of the way from the least.
	got := score(build(t, ""), cs, &scheduling.Request{TTFTSLO: time.Second}, eps)
	schedtest.ExpectScores(t, got, []float64{0.51, 0.5 + 0.5*(0.02+0.98*3/7), 1})
}

func TestScoreBufferFactor(t *testing.T) {
	eps := fleet("a")
	cs := withPredictions(eps, latency.Estimate{TTFTQuantile: ms(600)})
	req := &scheduling.Request{TTFTSLO: time.Second}
	s := build(t, "")
	if got := score(s, cs, req, eps)[0]; got <= 0.5 {
		t.Fatalf("600ms against a 1s SLO scored %v, want a meeting score", got)
	}
	preds, _ := scheduling.Read(cs, latency.PredictionsKey)
	preds.BufferFactor = 2
	if got := score(s, cs, req, eps)[0]; got >= 0.5 {
		t.Fatalf("600ms doubled against a 1s SLO scored %v, want a missing score", got)
	}
}

func TestCompositeFallback(t *testing.T) {
	mk := func() []*endpoints.Endpoint {
		return []*endpoints.Endpoint{
			schedtest.Endpoint("a", endpoints.Metrics{KVCacheUsage: 0.2}),
			schedtest.Endpoint("b", endpoints.Metrics{KVCacheUsage: 0.5, WaitingQueueSize: 4}),
			schedtest.Endpoint("c", endpoints.Metrics{KVCacheUsage: 1.5, WaitingQueueSize: 2}),
		}
	}
	match := func(eps []*endpoints.Endpoint) *scheduling.CycleState {
		m := &prefixmatch.Prediction{BlockTokens: 16, PromptTokens: 160}
		m.Reset(eps)
		m.Matched(0, 10) // the whole prompt
		m.Matched(2, 5)  // half of it
		cs := scheduling.NewCycleState()
		scheduling.Write(cs, prefixmatch.MatchKey, m)
		return cs
	}
	none := func([]*endpoints.Endpoint) *scheduling.CycleState { return scheduling.NewCycleState() }
	tests := []struct {
		name   string
		params string
		cs     func([]*endpoints.Endpoint) *scheduling.CycleState
		want   []float64
	}{
		// KV use above 1 is clamped: a bad scrape cannot score negative.
		{"kv and queue", "", none, []float64{(0.8 + 1) / 3, (0.5 + 0) / 3, (0 + 0.5) / 3}},
		{"with prefix match", "", match, []float64{(0.8 + 1 + 1) / 3, (0.5 + 0 + 0) / 3, (0 + 0.5 + 0.5) / 3}},
		{"kv only", `{"compositeQueueWeight": 0, "compositePrefixWeight": 0}`, match, []float64{0.8, 0.5, 0}},
		{"queue only", `{"compositeKVWeight": 0, "compositePrefixWeight": 0}`, none, []float64{1, 0, 0.5}},
		{"prefix only", `{"compositeKVWeight": 0, "compositeQueueWeight": 0}`, match, []float64{1, 0, 0.5}},
		{"all weights zero", `{"compositeKVWeight": 0, "compositeQueueWeight": 0, "compositePrefixWeight": 0}`, match, []float64{0, 0, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := mk()
			schedtest.ExpectScores(t, score(build(t, tc.params), tc.cs(eps), &scheduling.Request{TTFTSLO: time.Second}, eps), tc.want)
		})
	}
	t.Run("no queue anywhere", func(t *testing.T) {
		eps := []*endpoints.Endpoint{schedtest.Endpoint("x", endpoints.Metrics{}), schedtest.Endpoint("y", endpoints.Metrics{KVCacheUsage: 1})}
		schedtest.ExpectScores(t, score(build(t, `{"compositePrefixWeight": 0}`), none(eps), &scheduling.Request{}, eps), []float64{1, 0.5})
	})
}

func TestParams(t *testing.T) {
	for _, good := range []string{"", "null", "{}", `{"headroomSelectionStrategy": "most"}`, `{"ttftWeight": 0, "tpotWeight": 1}`, `{"compositeKVWeight": 0, "compositeQueueWeight": 0, "compositePrefixWeight": 0}`} {
		if _, err := schedtest.Build[*Scorer](New, good); err != nil {
			t.Errorf("%s refused: %v", good, err)
		}
	}
	for _, bad := range []string{
		`{"headroomSelectionStrategy": "middle"}`,
		`{"headroomSelectionStrategy": ""}`,
		`{"ttftWeight": -0.1}`,
		`{"tpotWeight": -1}`,
		`{"compositeKVWeight": -1}`,
		`{"compositeQueueWeight": -1}`,
		`{"compositePrefixWeight": -1}`,
		`{"ttftWeight": 0, "tpotWeight": 0}`,
		`{"ttftWeigth": 1}`,
		`{"ttftWeight": "high"}`,
	} {
		if _, err := New("", []byte(bad), &scheduling.Handle{}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	p, err := New("fast", nil, &scheduling.Handle{})
	if err != nil {
		t.Fatal(err)
	}
	if tn := p.TypedName(); tn != (scheduling.TypedName{Type: Type, Name: "fast"}) {
		t.Errorf("TypedName %+v", tn)
	}
}

// TestWithProducer scores what the real producer predicts, so that the
// scorer's reading of the estimates matches how they are produced.
func TestWithProducer(t *testing.T) {
	eps := fleet("busy", "idle")
	eps[0].Charge(0, 20000, 20000, 20000)
	prod, err := schedtest.Build[scheduling.DataProducer](predictedlatency.New, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []*scheduling.Request{{PromptTokens: 1000}, {PromptTokens: 1000, TTFTSLO: time.Second}} {
		cs := scheduling.NewCycleState()
		prod.Produce(context.Background(), cs, req, eps)
		got := score(build(t, ""), cs, req, eps)
		if got[1] <= got[0] {
			t.Errorf("SLO %v: scores %v, want the idle endpoint first", req.TTFTSLO, got)
		}
		if req.TTFTSLO == 0 && got[1] != 1 {
			t.Errorf("the fastest endpoint scored %v, want 1", got[1])
		}
	}
}

// TestFastestTTFTMatchesRelative: the TTFT-only pass (tpotWeight 0) scores
// bit for bit as the general one, whatever the TTFT weight and TPOTs.
func TestFastestTTFTMatchesRelative(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, w := range []float64{1, 0.8, 0.37, 3} {
		est := make([]latency.Estimate, 257)
		for k := range est {
			est[k] = latency.Estimate{TTFT: time.Duration(1 + rng.Int64N(int64(20*time.Second))), TPOT: time.Duration(rng.Int64N(int64(50 * time.Millisecond)))}
			if k%3 == 0 { // a burst-mate's imposed delay counts in both
				est[k].Imposed = time.Duration(rng.Int64N(int64(time.Second)))
			}
		}
		got := make([]float64, len(est))
		fastestTTFT(est, got, w)
		var bestTTFT, bestTPOT float64
		for k := range est {
			bestTTFT, bestTPOT = best(bestTTFT, bestTPOT, &est[k])
		}
		for k := range est {
			if want := relative(&est[k], bestTTFT, bestTPOT, w, 0); got[k] != want {
				t.Fatalf("weight %v, candidate %d: %v, want %v", w, k, got[k], want)
			}
		}
	}
}

// TestDeferredTPOTScored: the producer leaves TPOT to be computed where it
// is read; a scorer weighing TPOT, or ranking by a TPOT SLO, scores as it
// would over estimates computed in full, and TPOT does change its scores.
func TestDeferredTPOTScored(t *testing.T) {
	eps := fleet("slow-decode", "fast-decode")
	prod, err := schedtest.Build[*predictedlatency.Producer](predictedlatency.New, "")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 * latency.DefaultMinSamples {
		prod.Model().ObserveTPOT(eps[0].Address(), latency.Features{Decodes: 1}, ms(40))
		prod.Model().ObserveTPOT(eps[1].Address(), latency.Features{Decodes: 1}, ms(10))
	}
	for _, tc := range []struct {
		params string
		req    scheduling.Request
	}{
		{`{"ttftWeight": 0.5, "tpotWeight": 0.5}`, scheduling.Request{PromptTokens: 1000}},
		{`{"ttftWeight": 0.5, "tpotWeight": 0.5}`, scheduling.Request{PromptTokens: 1000, TPOTSLO: ms(30)}},
		{`{"tpotWeight": 0}`, scheduling.Request{PromptTokens: 1000, TTFTSLO: time.Second, TPOTSLO: ms(30)}},
	} {
		s := build(t, tc.params)
		scoreOnce := func(full bool) []float64 {
			cs := scheduling.NewCycleState()
			prod.Produce(context.Background(), cs, &tc.req, eps)
			if full {
				preds, _ := scheduling.Read(cs, latency.PredictionsKey)
				preds.FillTPOT()
			}
			return score(s, cs, &tc.req, eps)
		}
		deferred, full := scoreOnce(false), scoreOnce(true)
		if deferred[0] != full[0] || deferred[1] != full[1] {
			t.Errorf("%s %+v: deferred TPOT scores %v, computed in full %v", tc.params, tc.req, deferred, full)
		}
		if deferred[1] <= deferred[0] {
			t.Errorf("%s %+v: scores %v, want the fast decoder first", tc.params, tc.req, deferred)
		}
	}
}
