package predictedlatencyscorer

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func msd(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// scripted is a Rand whose Float64 draws come from a script (then 0.5), so
// that each exploration coin is set by the test; IntN is seeded.
type scripted struct {
	floats []float64
	r      *rand.Rand
}

func (s *scripted) Float64() float64 {
	if len(s.floats) == 0 {
		return 0.5
	}
	f := s.floats[0]
	s.floats = s.floats[1:]
	return f
}

func (s *scripted) IntN(n int) int { return s.r.IntN(n) }

func build(t *testing.T, params string, r scheduling.Rand) *Scorer {
	t.Helper()
	var raw []byte
	if params != "" {
		raw = []byte(params)
	}
	p, err := New("", raw, &scheduling.Handle{Rand: r})
	if err != nil {
		t.Fatalf("New(%s): %v", params, err)
	}
	return p.(*Scorer)
}

func TestParams(t *testing.T) {
	tests := []struct {
		name, params string
		wantErr      string // "" for success
		unsupported  string // the refused parameter, for UnsupportedParameterError
		check        func(*testing.T, *Scorer)
	}{
		{name: "defaults", check: func(t *testing.T, s *Scorer) {
			if d := defaults(); s.params.AffinityGateTau != 0.8 || s.params.AffinityGateTauGlobal != 0.99 || !s.params.StreamingMode || s.params.HeadroomSelectionStrategy != d.HeadroomSelectionStrategy {
				t.Errorf("defaults = %+v", s.params)
			}
		}},
		{name: "upstream troubleshooting guide", params: `{"samplingMean": 1000.0}`},
		{name: "contextTTL in nanoseconds", params: `{"contextTTL": 120000000000}`},
		{name: "contextTTL as a string", params: `{"contextTTL": "2m"}`},
		{name: "every strategy", params: `{"headroomSelectionStrategy": "composite-only", "selectionMode": "max"}`},
		{name: "gates off", params: `{"affinityGateTau": 0, "affinityGateTauGlobal": 0, "affinityMaxTTFTPenaltyMs": 0}`, check: func(t *testing.T, s *Scorer) {
			if s.params.AffinityGateTau != 0 || s.params.AffinityGateTauGlobal != 0 {
				t.Errorf("explicit zeros must override the defaults: %+v", s.params)
			}
		}},
		{name: "samplingMean refused", params: `{"samplingMean": 200}`, wantErr: "samplingMean", unsupported: "samplingMean"},
		{name: "maxSampledTokens refused", params: `{"maxSampledTokens": 20}`, wantErr: "maxSampledTokens", unsupported: "maxSampledTokens"},
		{name: "sloBufferFactor", params: `{"sloBufferFactor": 0}`, wantErr: "sloBufferFactor"},
		{name: "negative weight", params: `{"headroomTPOTWeight": -1}`, wantErr: "headroomTPOTWeight"},
		{name: "negative composite weight", params: `{"compositeQueueWeight": -0.5}`, wantErr: "compositeQueueWeight"},
		{name: "negative penalty", params: `{"affinityMaxTTFTPenaltyMs": -1}`, wantErr: "affinityMaxTTFTPenaltyMs"},
		{name: "epsilon above 1", params: `{"epsilonExploreNeg": 1.5}`, wantErr: "epsilonExploreNeg"},
		{name: "sticky epsilon", params: `{"epsilonExploreSticky": -0.1}`, wantErr: "epsilonExploreSticky"},
		{name: "tau above 1", params: `{"affinityGateTau": 2}`, wantErr: "affinityGateTau"},
		{name: "global tau", params: `{"affinityGateTauGlobal": -1}`, wantErr: "affinityGateTauGlobal"},
		{name: "strategy", params: `{"headroomSelectionStrategy": "random"}`, wantErr: "headroomSelectionStrategy"},
		{name: "selection mode", params: `{"selectionMode": "softmax"}`, wantErr: "selectionMode"},
		{name: "contextTTL zero", params: `{"contextTTL": 0}`, wantErr: "contextTTL"},
		{name: "contextTTL bad string", params: `{"contextTTL": "soon"}`, wantErr: "contextTTL"},
		{name: "unknown parameter", params: `{"affinityGate": 0.5}`, wantErr: "affinityGate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := schedtest.Build[*Scorer](New, tc.params)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tc.check != nil {
					tc.check(t, p)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one naming %s", err, tc.wantErr)
			}
			var unsup *scheduling.UnsupportedParameterError
			if got := errors.As(err, &unsup); got != (tc.unsupported != "") || (got && unsup.Param != tc.unsupported) {
				t.Errorf("UnsupportedParameterError = %v (%v), want %q", got, unsup, tc.unsupported)
			}
		})
	}
}

// fleet is three endpoints with predictions (ms of the quantiles) and the
// prefix-cache share each holds.
type pred struct {
	name       string
	ttft, tpot float64
	held       float64
	kv         float64
	queue      int
}

func setup(preds []pred) ([]*endpoints.Endpoint, *scheduling.CycleState) {
	eps := make([]*endpoints.Endpoint, len(preds))
	for i, p := range preds {
		eps[i] = schedtest.Endpoint(p.name, endpoints.Metrics{KVCacheUsage: p.kv, WaitingQueueSize: p.queue})
	}
	lp := &latency.Predictions{}
	lp.Reset(eps)
	for i, p := range preds {
		lp.Estimates[i] = latency.Estimate{TTFT: msd(p.ttft / 2), TTFTQuantile: msd(p.ttft), TPOT: msd(p.tpot / 2), TPOTQuantile: msd(p.tpot)}
		lp.Held[i] = p.held
	}
	cs := scheduling.NewCycleState()
	scheduling.Write(cs, latency.PredictionsKey, lp)
	return eps, cs
}

func chosen(eps []*endpoints.Endpoint, scores []float64) string {
	out := ""
	for i, s := range scores {
		switch s {
		case 1:
			if out != "" {
				return "several"
			}
			out = eps[i].Name()
		case 0:
		default:
			return "a score that is neither 0 nor 1"
		}
	}
	return out
}

func TestPick(t *testing.T) {
	// Against a 1000ms TTFT SLO and a 100ms TPOT SLO: a has the most
	// headroom, b the least, c misses TTFT, d misses both.
	base := []pred{
		{name: "a", ttft: 200, tpot: 20},
		{name: "b", ttft: 800, tpot: 80},
		{name: "c", ttft: 1500, tpot: 50},
		{name: "d", ttft: 3000, tpot: 300},
	}
	with := func(f func([]pred)) []pred {
		p := append([]pred(nil), base...)
		f(p)
		return p
	}
	slo := scheduling.Request{ID: "r", TTFTSLO: time.Second, TPOTSLO: msd(100)}
	noExplore := `"selectionMode": "max", "epsilonExploreNeg": 0, "epsilonExploreSticky": 0`
	tests := []struct {
		name    string
		params  string
		preds   []pred
		req     scheduling.Request
		floats  []float64 // scripted coins
		running map[string]float64
		subset  []int // candidate indices scored (default all)
		want    string
	}{
		{name: "least packs onto the tightest positive", params: noExplore, preds: base, req: slo, want: "b"},
		{name: "most spreads onto the roomiest", params: `"headroomSelectionStrategy": "most", ` + noExplore, preds: base, req: slo, want: "a"},
		{name: "no SLO: all negative, least deficit", params: noExplore, preds: base, req: scheduling.Request{ID: "r"}, want: "a"},
		{name: "negative tier prefers idle endpoints", params: noExplore, preds: base, req: scheduling.Request{ID: "r"}, running: map[string]float64{"a": 0}, want: "b"},
		// Within a violation class the smaller deficit weighs more.
		{name: "smaller TTFT deficit", params: noExplore, req: slo, subset: []int{2, 3}, preds: with(func(p []pred) { p[3].ttft, p[3].tpot = 1200, 50 }), want: "d"},
		// Each class is normalised within itself (GIE's weights): the best
		// of every class weighs the same, and max takes the first class,
		// both objectives missed, over c's TTFT-only miss.
		{name: "classes weigh alike", params: noExplore, req: slo, subset: []int{2, 3}, preds: base, want: "d"},
		{name: "explore the negative tier", params: `"selectionMode": "max", "epsilonExploreNeg": 0.5, "epsilonExploreSticky": 0`, preds: base, req: slo, floats: []float64{0.4}, subset: []int{0, 1, 2}, want: "c"},
		{name: "coin above epsilon stays positive", params: `"selectionMode": "max", "epsilonExploreNeg": 0.5, "epsilonExploreSticky": 0`, preds: base, req: slo, floats: []float64{0.6}, want: "b"},
		{name: "global gate keeps the full hit", params: noExplore, preds: with(func(p []pred) { p[2].held = 1 }), req: slo, want: "c"},
		{name: "global gate below tau", params: noExplore, preds: with(func(p []pred) { p[2].held = 0.98 }), req: slo, want: "b"},
		{name: "global gate off", params: `"affinityGateTauGlobal": 0, ` + noExplore, preds: with(func(p []pred) { p[2].held = 1 }), req: slo, want: "b"},
		{name: "load gate breaks stickiness", params: noExplore, preds: with(func(p []pred) { p[3].held = 1; p[3].ttft = 6000 }), req: slo, want: "b"},
		{name: "load gate within the penalty", params: `"affinityMaxTTFTPenaltyMs": 6000, ` + noExplore, preds: with(func(p []pred) { p[3].held = 1; p[3].ttft = 6000 }), req: slo, want: "d"},
		{name: "sticky exploration skips the gate", params: `"selectionMode": "max", "epsilonExploreNeg": 0, "epsilonExploreSticky": 0.5`, preds: with(func(p []pred) { p[2].held = 1 }), req: slo, floats: []float64{0.1}, want: "b"},
		{name: "positive gate: a cached candidate", params: noExplore, preds: with(func(p []pred) { p[0].held = 0.85 }), req: slo, want: "a"},
		{name: "positive gate below tau", params: noExplore, preds: with(func(p []pred) { p[0].held = 0.75 }), req: slo, want: "b"},
		{name: "negative gate", params: noExplore, preds: with(func(p []pred) { p[3].held = 0.9 }), req: scheduling.Request{ID: "r"}, want: "d"},
		// A missing TPOT SLO is 0: a and b miss TPOT alone, a by less.
		{name: "streaming without a TPOT SLO: all negative", params: noExplore, preds: base, req: scheduling.Request{ID: "r", TTFTSLO: time.Second}, subset: []int{0, 1}, want: "a"},
		{name: "non-streaming ignores TPOT", params: `"streamingMode": false, ` + noExplore, preds: base, req: scheduling.Request{ID: "r", TTFTSLO: time.Second}, want: "b"},
		{name: "sloBufferFactor scales the TPOT SLO", params: `"sloBufferFactor": 0.5, ` + noExplore, preds: base, req: slo, want: "a"},
		{name: "running TPOT SLO tightens the endpoint", params: noExplore, preds: base, req: slo, running: map[string]float64{"b": 50}, want: "a"},
		{name: "running request without a TPOT SLO", params: noExplore, preds: base, req: slo, running: map[string]float64{"b": 0}, want: "b"},
		{name: "a filtered subset", params: noExplore, preds: base, req: slo, subset: []int{0, 2}, want: "a"},
		{name: "composite-only: free KV", params: `"headroomSelectionStrategy": "composite-only", ` + noExplore, preds: with(func(p []pred) { p[0].kv, p[1].kv, p[2].kv, p[3].kv = 0.9, 0.9, 0.1, 0.9 }), req: slo, want: "c"},
		{name: "composite-most over positives", params: `"headroomSelectionStrategy": "composite-most", ` + noExplore, preds: with(func(p []pred) { p[0].queue, p[1].queue = 0, 9 }), req: slo, want: "a"},
		{name: "composite-least over positives", params: `"headroomSelectionStrategy": "composite-least", ` + noExplore, preds: with(func(p []pred) { p[0].queue, p[1].queue = 0, 9 }), req: slo, want: "b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t, "{"+tc.params+"}", &scripted{floats: tc.floats, r: rand.New(rand.NewPCG(1, 2))})
			eps, cs := setup(tc.preds)
			for name, tpot := range tc.running {
				for _, e := range eps {
					if e.Name() == name {
						s.PreRequest(context.Background(), cs, &scheduling.Request{ID: "running-" + name, TPOTSLO: msd(tpot)},
							&scheduling.Result{PrimaryProfile: "p", Profiles: map[string]*scheduling.ProfileResult{"p": {Targets: []*endpoints.Endpoint{e}}}})
					}
				}
			}
			in := eps
			if tc.subset != nil {
				in = nil
				for _, i := range tc.subset {
					in = append(in, eps[i])
				}
			}
			scores := make([]float64, len(in))
			s.Score(context.Background(), cs, &tc.req, in, scores)
			if got := chosen(in, scores); got != tc.want {
				t.Errorf("picked %q, want %q", got, tc.want)
			}
		})
	}
}

// TestDraws checks the weighted random pick and the exploration rates
// with a seeded source: the shares follow GIE's integer weights.
func TestDraws(t *testing.T) {
	base := []pred{{name: "a", ttft: 200, tpot: 20}, {name: "b", ttft: 800, tpot: 80}, {name: "c", ttft: 1500, tpot: 50}}
	slo := &scheduling.Request{ID: "r", TTFTSLO: time.Second, TPOTSLO: msd(100)}
	tests := []struct {
		name   string
		params string
		want   map[string]float64 // expected share of picks
		noSLO  bool
	}{
		// Weights 2 (a) and 100 (b) in the positive tier.
		{"least", `{"epsilonExploreNeg": 0, "epsilonExploreSticky": 0}`, map[string]float64{"a": 2.0 / 102, "b": 100.0 / 102}, false},
		{"most", `{"headroomSelectionStrategy": "most", "epsilonExploreNeg": 0}`, map[string]float64{"a": 100.0 / 102, "b": 2.0 / 102}, false},
		// The negative tier (c alone) with probability epsilonExploreNeg.
		{"exploration", `{"epsilonExploreNeg": 0.2}`, map[string]float64{"a": 0.8 * 2 / 102, "b": 0.8 * 100 / 102, "c": 0.2}, false},
		// No SLO (0): every candidate misses both objectives. Deficits
		// normalised over the class, blended 0.8/0.2: a 0 → weight 82,
		// b 0.57 → 36, c 0.9 → 10.
		{"negative tier", `{"epsilonExploreNeg": 0, "epsilonExploreSticky": 0}`, map[string]float64{"a": 82.0 / 128, "b": 36.0 / 128, "c": 10.0 / 128}, true},
	}
	const n = 20000
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t, tc.params, rand.New(rand.NewPCG(7, 11)))
			eps, cs := setup(base)
			req := slo
			if tc.noSLO {
				req = &scheduling.Request{ID: "r"}
			}
			counts := map[string]int{}
			for range n {
				scores := make([]float64, len(eps))
				s.Score(context.Background(), cs, req, eps, scores)
				counts[chosen(eps, scores)]++
			}
			for name, share := range tc.want {
				got := float64(counts[name]) / n
				if tol := 4 * math.Sqrt(share*(1-share)/n); math.Abs(got-share) > tol+1e-3 {
					t.Errorf("%s picked %.4f of the time, want %.4f", name, got, share)
				}
			}
			if len(counts) > len(tc.want) {
				t.Errorf("picks %v outside %v", counts, tc.want)
			}
		})
	}
}

func TestNoPredictions(t *testing.T) {
	s := build(t, `{"selectionMode": "max"}`, nil)
	eps := []*endpoints.Endpoint{
		schedtest.Endpoint("full", endpoints.Metrics{KVCacheUsage: 0.9, WaitingQueueSize: 4}),
		schedtest.Endpoint("free", endpoints.Metrics{KVCacheUsage: 0.1}),
	}
	scores := make([]float64, 2)
	s.Score(context.Background(), scheduling.NewCycleState(), &scheduling.Request{ID: "r"}, eps, scores)
	if got := chosen(eps, scores); got != "free" {
		t.Errorf("composite fallback picked %q, want free", got)
	}
}

func TestAdmit(t *testing.T) {
	miss := []pred{{name: "a", ttft: 2000, tpot: 20, kv: 0.5}, {name: "b", ttft: 3000, tpot: 20, kv: 0.5}}
	sheddable := scheduling.Request{ID: "r", Priority: -1, TTFTSLO: time.Second, TPOTSLO: msd(100)}
	tests := []struct {
		name    string
		params  string
		preds   []pred
		req     scheduling.Request
		running []string
		refused bool
	}{
		{name: "all busy and missing", preds: miss, req: sheddable, running: []string{"a", "b"}, refused: true},
		{name: "not sheddable", preds: miss, req: scheduling.Request{ID: "r", TTFTSLO: time.Second, TPOTSLO: msd(100)}, running: []string{"a", "b"}},
		{name: "an idle endpoint", preds: miss, req: sheddable, running: []string{"a"}},
		{name: "one meets the SLO", preds: []pred{{name: "a", ttft: 500, tpot: 20, kv: 0.5}, miss[1]}, req: sheddable, running: []string{"a", "b"}},
		{name: "a cold endpoint", preds: []pred{{name: "a", ttft: 2000, tpot: 20, kv: 0.01}, miss[1]}, req: sheddable, running: []string{"a", "b"}},
		{name: "a sticky endpoint", preds: []pred{{name: "a", ttft: 2000, tpot: 20, kv: 0.5, held: 1}, miss[1]}, req: sheddable, running: []string{"a", "b"}},
		{name: "no TTFT SLO", preds: miss, req: scheduling.Request{ID: "r", Priority: -1, TPOTSLO: msd(100)}, running: []string{"a", "b"}},
		{name: "streaming needs a TPOT SLO", preds: miss, req: scheduling.Request{ID: "r", Priority: -1, TTFTSLO: time.Second}, running: []string{"a", "b"}},
		{name: "non-streaming: TTFT alone", params: `{"streamingMode": false}`, preds: miss, req: scheduling.Request{ID: "r", Priority: -1, TTFTSLO: time.Second}, running: []string{"a", "b"}, refused: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t, tc.params, nil)
			eps, cs := setup(tc.preds)
			for _, name := range tc.running {
				for _, e := range eps {
					if e.Name() == name {
						s.PreRequest(context.Background(), cs, &scheduling.Request{ID: "running-" + name},
							&scheduling.Result{PrimaryProfile: "p", Profiles: map[string]*scheduling.ProfileResult{"p": {Targets: []*endpoints.Endpoint{e}}}})
					}
				}
			}
			err := s.Admit(context.Background(), cs, &tc.req, eps)
			if (err != nil) != tc.refused || (err != nil && !errors.Is(err, ErrNoValidEndpoint)) {
				t.Errorf("Admit = %v, refused want %v", err, tc.refused)
			}
		})
	}
}

// TestLifecycle runs the scorer as the scheduler does — produce, score,
// pre-request, response — and checks that it predicts by itself and that a
// request stops counting as running when it ends.
func TestLifecycle(t *testing.T) {
	s := build(t, `{"selectionMode": "max", "epsilonExploreNeg": 0, "epsilonExploreSticky": 0}`, nil)
	eps := []*endpoints.Endpoint{schedtest.Endpoint("x", endpoints.Metrics{}), schedtest.Endpoint("y", endpoints.Metrics{})}
	ctx := context.Background()
	req := &scheduling.Request{ID: "r1", PromptTokens: 100, Stream: true, TPOTSLO: msd(40)}
	cs := scheduling.NewCycleState()
	s.Produce(ctx, cs, req, eps)
	if _, ok := scheduling.Read(cs, latency.PredictionsKey); !ok {
		t.Fatal("the scorer wrote no predictions")
	}
	scores := make([]float64, len(eps))
	s.Score(ctx, cs, req, eps, scores)
	picked := chosen(eps, scores)
	if picked != "x" && picked != "y" {
		t.Fatalf("picked %q", picked)
	}
	target := eps[0]
	if picked == "y" {
		target = eps[1]
	}
	s.PreRequest(ctx, cs, req, &scheduling.Result{PrimaryProfile: "p", Profiles: map[string]*scheduling.ProfileResult{"p": {Targets: []*endpoints.Endpoint{target}}}})
	if n, tpot := s.runningOf(target.Address()); n != 1 || tpot != 40 {
		t.Errorf("running on target = %d, min TPOT SLO %v; want 1, 40", n, tpot)
	}
	res := &scheduling.Response{Endpoint: target, Status: 200, Complete: true, TTFT: msd(50), TPOT: msd(10)}
	s.FirstToken(ctx, cs, req, res)
	s.ResponseComplete(ctx, cs, req, res)
	if n, _ := s.runningOf(target.Address()); n != 0 {
		t.Errorf("%d requests still running after the response", n)
	}
	if len(s.running) != 0 {
		t.Errorf("running map keeps %d endpoints", len(s.running))
	}
	s.PreRequest(ctx, cs, &scheduling.Request{ID: "r2"}, &scheduling.Result{PrimaryProfile: "p", Profiles: map[string]*scheduling.ProfileResult{"p": {Targets: []*endpoints.Endpoint{target}}}})
	s.EndpointsRemoved([]string{target.Address()})
	if len(s.running) != 0 {
		t.Errorf("EndpointsRemoved left %d endpoints", len(s.running))
	}
}

// TestRunningDuplicateIDs: requests are tracked by their cycle state, so
// two that share an x-request-id both count until each ends.
func TestRunningDuplicateIDs(t *testing.T) {
	s := build(t, "", nil)
	e := schedtest.Endpoint("x", endpoints.Metrics{})
	ctx := context.Background()
	res := &scheduling.Result{PrimaryProfile: "p", Profiles: map[string]*scheduling.ProfileResult{"p": {Targets: []*endpoints.Endpoint{e}}}}
	req := &scheduling.Request{ID: "same", TPOTSLO: msd(30)}
	cs1, cs2 := scheduling.NewCycleState(), scheduling.NewCycleState()
	s.PreRequest(ctx, cs1, req, res)
	s.PreRequest(ctx, cs2, &scheduling.Request{ID: "same", TPOTSLO: msd(60)}, res)
	if n, tpot := s.runningOf(e.Address()); n != 2 || tpot != 30 {
		t.Fatalf("running = %d, min TPOT %v; want 2, 30", n, tpot)
	}
	s.ResponseComplete(ctx, cs1, req, &scheduling.Response{Endpoint: e, Status: 200, Complete: true})
	if n, tpot := s.runningOf(e.Address()); n != 1 || tpot != 60 {
		t.Errorf("after one ends: running = %d, min TPOT %v; want 1, 60", n, tpot)
	}
}

// FuzzNew: any parameters either build a scorer or fail with an error.
func FuzzNew(f *testing.F) {
	for _, seed := range []string{`{}`, `{"samplingMean": 1000.0}`, `{"contextTTL": 300000000000}`, `{"contextTTL": "1m"}`,
		`{"headroomSelectionStrategy": "composite-least", "selectionMode": "max"}`, `{"affinityGateTau": 2}`, `null`, `[`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, params string) {
		p, err := New("", []byte(params), nil)
		if err == nil && p == nil {
			t.Fatal("nil plugin without an error")
		}
	})
}
