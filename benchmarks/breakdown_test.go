package benchmarks

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/benchmarks/cluster"
)

const ms = time.Millisecond

func TestSummarizeSLO(t *testing.T) {
	// Four requests carry the SLO (one failed), one does not and would
	// miss everything.
	reqs := []cluster.RequestResult{
		{SLO: true, TTFT: 400 * ms, TPOT: 40 * ms, OutputTokens: 10},
		{SLO: true, TTFT: 600 * ms, TPOT: 30 * ms, OutputTokens: 10},
		{SLO: true, TTFT: 300 * ms, TPOT: 80 * ms, OutputTokens: 10},
		{SLO: true, Err: "refused"},
		{TTFT: 9 * time.Second, TPOT: time.Second, OutputTokens: 10},
	}
	tests := []struct {
		name                string
		slo                 cluster.SLO
		ttft, tpot, both, n float64
		none                bool
	}{
		{"both objectives", cluster.SLO{TTFT: 500 * ms, TPOT: 50 * ms}, 2.0 / 4, 2.0 / 4, 1.0 / 4, 4, false},
		{"TTFT only", cluster.SLO{TTFT: 500 * ms}, 2.0 / 4, 3.0 / 4, 2.0 / 4, 4, false},
		{"TPOT only", cluster.SLO{TPOT: 35 * ms}, 3.0 / 4, 1.0 / 4, 1.0 / 4, 4, false},
		{"objective met at equality", cluster.SLO{TTFT: 600 * ms}, 3.0 / 4, 3.0 / 4, 3.0 / 4, 4, false},
		{"no SLO", cluster.SLO{}, 0, 0, 0, 0, true},
	}
	for _, tc := range tests {
		got := summarizeSLO(&cluster.Result{Requests: reqs, SLO: tc.slo})
		if tc.none {
			if got != nil {
				t.Errorf("%s: %+v, want none", tc.name, got)
			}
			continue
		}
		if got == nil {
			t.Fatalf("%s: no SLO summary", tc.name)
		}
		if float64(got.Requests) != tc.n || got.TTFTMet != tc.ttft || got.TPOTMet != tc.tpot || got.BothMet != tc.both {
			t.Errorf("%s: %+v, want %v requests, met %v %v %v", tc.name, got, tc.n, tc.ttft, tc.tpot, tc.both)
		}
	}
}

func TestSummarizePredictions(t *testing.T) {
	h100, h200 := "llama-3.1-8b-h100", "llama-3.1-8b-h200"
	tests := []struct {
		name     string
		reqs     []cluster.RequestResult
		ttftMAPE float64
		tpotMAPE float64
		ttftN    int
		tpotN    int
		// notJoined: the TTFT MAPE and count without the joined requests
		// (-1: the same as all).
		notJoined  float64
		notJoinedN int
		presets    map[string][4]float64 // predicted and actual mean TTFT, TPOT
		presetMAPE map[string][4]float64 // TTFT MAPE, all and not joined; TPOT MAPE; TPOT within its quantile
		none       bool
	}{
		{
			name: "two presets, some predictions",
			reqs: []cluster.RequestResult{
				{Preset: h100, TTFT: 100 * ms, PredictedTTFT: 150 * ms, TPOT: 20 * ms, PredictedTPOT: 10 * ms, PredictedTPOTQuantile: 15 * ms, OutputTokens: 5},
				{Preset: h100, TTFT: 200 * ms, PredictedTTFT: 150 * ms, OutputTokens: 1}, // one token: no TPOT to score
				{Preset: h200, TTFT: 400 * ms, PredictedTTFT: 400 * ms, TPOT: 10 * ms, PredictedTPOT: 10 * ms, PredictedTPOTQuantile: 10 * ms, OutputTokens: 5},
				{Preset: h200, TTFT: 50 * ms, TPOT: 5 * ms, OutputTokens: 5}, // no prediction
				{Preset: h200, Err: "refused", PredictedTTFT: time.Second},
			},
			// |150-100|/100, |150-200|/200, 0; |10-20|/20, 0.
			ttftMAPE: (0.5 + 0.25 + 0) / 3, ttftN: 3,
			tpotMAPE: (0.5 + 0) / 2, tpotN: 2,
			notJoined: -1,
			presets: map[string][4]float64{
				h100: {0.150, 0.150, 0.010, 0.020},
				h200: {0.400, 0.400, 0.010, 0.010},
			},
			presetMAPE: map[string][4]float64{h100: {0.375, 0.375, 0.5, 0}, h200: {0, 0, 0, 1}}, // 20 ms over its 15 ms quantile; 10 ms at its own
		},
		{
			// The prediction is made at the decision: a flow-control
			// queue's wait before it is not scored; a joined request is
			// left out of the not-joined figure only.
			name: "queued and joined",
			reqs: []cluster.RequestResult{
				{Preset: h100, TTFT: 300 * ms, Queued: 200 * ms, PredictedTTFT: 100 * ms},
				{Preset: h100, TTFT: 200 * ms, PredictedTTFT: 100 * ms, Joined: true},
			},
			ttftMAPE: (0 + 0.5) / 2, ttftN: 2,
			notJoined: 0, notJoinedN: 1,
			presets:    map[string][4]float64{h100: {0.100, 0.150, 0, 0}},
			presetMAPE: map[string][4]float64{h100: {0.25, 0, 0, 0}},
		},
		{
			name:    "mixed fleet without predictions",
			reqs:    []cluster.RequestResult{{Preset: h100, TTFT: ms}, {Preset: h200, TTFT: ms}},
			presets: map[string][4]float64{h100: {}, h200: {}},
		},
		{
			name: "one preset without predictions",
			reqs: []cluster.RequestResult{{Preset: h100, TTFT: ms}, {Preset: h100, TTFT: 2 * ms}},
			none: true,
		},
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	for _, tc := range tests {
		presets, pred, points := summarizeByPreset(&cluster.Result{Requests: tc.reqs})
		if tc.none {
			if presets != nil || pred != nil || points != nil {
				t.Errorf("%s: %+v %+v %v, want nothing", tc.name, presets, pred, points)
			}
			continue
		}
		if tc.ttftN+tc.tpotN == 0 {
			if pred != nil || len(points) != 0 {
				t.Errorf("%s: predictions %+v %v from none", tc.name, pred, points)
			}
		} else if pred == nil || pred.TTFTRequests != tc.ttftN || pred.TPOTRequests != tc.tpotN ||
			!near(pred.TTFTMAPE, tc.ttftMAPE) || !near(pred.TPOTMAPE, tc.tpotMAPE) || len(points) != tc.ttftN {
			t.Errorf("%s: %+v with %d points, want MAPE %v over %d, %v over %d", tc.name, pred, len(points), tc.ttftMAPE, tc.ttftN, tc.tpotMAPE, tc.tpotN)
		}
		if pred != nil {
			want, n := tc.notJoined, tc.notJoinedN
			if want < 0 {
				want, n = tc.ttftMAPE, tc.ttftN
			}
			if !near(pred.TTFTMAPENotJoined, want) || pred.TTFTNotJoinedRequests != n {
				t.Errorf("%s: not joined %v over %d, want %v over %d", tc.name, pred.TTFTMAPENotJoined, pred.TTFTNotJoinedRequests, want, n)
			}
		}
		if len(presets) != len(tc.presets) {
			t.Fatalf("%s: presets %+v", tc.name, presets)
		}
		for _, p := range presets {
			w := tc.presets[p.Preset]
			if got := [4]float64{p.PredictedTTFTMean, p.ActualTTFTMean, p.PredictedTPOTMean, p.ActualTPOTMean}; !near(got[0], w[0]) || !near(got[1], w[1]) || !near(got[2], w[2]) || !near(got[3], w[3]) {
				t.Errorf("%s: %s means %v, want %v", tc.name, p.Preset, got, w)
			}
			if w := tc.presetMAPE[p.Preset]; !near(p.TTFTMAPE, w[0]) || !near(p.TTFTMAPENotJoined, w[1]) || !near(p.TPOTMAPE, w[2]) || !near(p.TPOTCovered, w[3]) {
				t.Errorf("%s: %s TTFT MAPE %v, not joined %v, TPOT MAPE %v, covered %v; want %v", tc.name, p.Preset, p.TTFTMAPE, p.TTFTMAPENotJoined, p.TPOTMAPE, p.TPOTCovered, w)
			}
		}
	}
}

// The SLO, MAPE and preset parts of the report appear only with their data.
func TestMarkdownOptionalParts(t *testing.T) {
	slo := func(ttft, tpot time.Duration) *SLOSummary {
		return &SLOSummary{TTFT: ttft.Seconds(), TPOT: tpot.Seconds(), Requests: 4, TTFTMet: 0.75, TPOTMet: 0.5, BothMet: 0.25}
	}
	mixed := []PresetSummary{{Preset: "a", Requests: 1}, {Preset: "b", Requests: 1}}
	tests := []struct {
		name      string
		s         Summary
		want, not []string
	}{
		{"plain", Summary{Name: "p"}, nil, []string{"SLO", "MAPE", "By preset", "Predicted vs actual"}},
		{"TTFT SLO", Summary{Name: "p", SLO: slo(500*ms, 0)}, []string{"| SLO requests | TTFT SLO met |", "| 4 | 0.750 |"}, []string{"TPOT SLO", "both", "MAPE"}},
		{"TPOT SLO", Summary{Name: "p", SLO: slo(0, 50*ms)}, []string{"| SLO requests | TPOT SLO met |", "| 4 | 0.500 |"}, []string{"TTFT SLO", "both"}},
		{"both SLOs", Summary{Name: "p", SLO: slo(500*ms, 50*ms)}, []string{"| TTFT SLO met | TPOT SLO met | both SLOs met |", "| 0.750 | 0.500 | 0.250 |"}, []string{"MAPE"}},
		{"predictions", Summary{Name: "p", Prediction: &PredictionSummary{TTFTRequests: 3, TTFTMAPE: 0.25}, Presets: mixed[:1]},
			[]string{"| TTFT MAPE | TPOT MAPE |", "| 25.0% | – |", "Predicted vs actual"}, []string{"SLO", "By preset"}},
		{"mixed fleet", Summary{Name: "p", Presets: mixed}, []string{"By preset", "| p | 0 | b | 1 |"}, []string{"MAPE", "Predicted vs actual"}},
	}
	for _, tc := range tests {
		md := Markdown(&Results{Workload: "w", Replicas: 2, Preset: "x", Policies: []Summary{tc.s}})
		for _, w := range tc.want {
			if !strings.Contains(md, w) {
				t.Errorf("%s: no %q in\n%s", tc.name, w, md)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(md, n) {
				t.Errorf("%s: unexpected %q in\n%s", tc.name, n, md)
			}
		}
		// Every row of the policy table has as many cells as its header.
		lines := strings.Split(md, "\n")
		if h, row := strings.Count(lines[2], "|"), strings.Count(lines[4], "|"); h != row {
			t.Errorf("%s: header has %d bars, row %d", tc.name, h, row)
		}
	}
}

// A run with TTFT predictions gets its scatter plot, named after it.
func TestPredictionPlot(t *testing.T) {
	dir := t.TempDir()
	r := &Results{Workload: "w", Policies: []Summary{
		{Name: "slo aware", QPSScale: 1, predTTFT: []predictedTTFT{{0.1, 0.12}, {0.3, 0.2}}},
		{Name: "random", QPSScale: 1},
	}}
	if err := writePlots(dir, r); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "ttft_predicted_*.png"))
	if len(files) != 1 || filepath.Base(files[0]) != "ttft_predicted_slo-aware.png" {
		t.Fatalf("prediction plots %v", files)
	}
	if st, err := os.Stat(files[0]); err != nil || st.Size() == 0 {
		t.Fatalf("plot: %v", err)
	}
}

func TestPredictionFile(t *testing.T) {
	for label, want := range map[string]string{
		"precise":         "ttft_predicted_precise.png",
		"approx ×2":       "ttft_predicted_approx-2.png",
		"My/Policy ×0.5":  "ttft_predicted_my-policy-0.5.png",
		"../x":            "ttft_predicted_..-x.png",
		"  slo-aware  ×1": "ttft_predicted_slo-aware-1.png",
	} {
		if got := predictionFile(label); got != want {
			t.Errorf("%q: %q, want %q", label, got, want)
		}
	}
}
