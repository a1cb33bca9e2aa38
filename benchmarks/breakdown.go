package benchmarks

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/plot"
)

// SLOSummary is SLO attainment over the requests that carried the SLO. A
// request that failed meets no objective.
type SLOSummary struct {
	// TTFT and TPOT are the objectives, zero when not set.
	TTFT     float64 `json:"ttft_s,omitempty"`
	TPOT     float64 `json:"tpot_s,omitempty"`
	Requests int     `json:"requests"`
	// TTFTMet and TPOTMet are the shares meeting each objective; BothMet
	// the share meeting every objective set.
	TTFTMet float64 `json:"ttft_met"`
	TPOTMet float64 `json:"tpot_met"`
	BothMet float64 `json:"both_met"`
}

// PredictionSummary is the accuracy of the picker's latency predictions
// over the completed requests that had one: the mean absolute percentage
// error, skipping requests whose actual value is zero. TTFT is compared
// from the decision (arrival plus any flow-control queueing), the instant
// the prediction is made at. The not-joined figures leave out the
// requests a later-routed request may have shared the first-token step
// with (cluster.RequestResult.Joined): the part no decision-time
// prediction can know.
type PredictionSummary struct {
	TTFTRequests          int     `json:"ttft_requests"`
	TTFTMAPE              float64 `json:"ttft_mape"`
	TPOTRequests          int     `json:"tpot_requests"`
	TPOTMAPE              float64 `json:"tpot_mape"`
	TTFTNotJoinedRequests int     `json:"ttft_not_joined_requests"`
	TTFTMAPENotJoined     float64 `json:"ttft_mape_not_joined"`
}

// PresetSummary is what the replicas of one preset delivered.
type PresetSummary struct {
	Preset string `json:"preset"`
	// Requests completed on the preset's replicas; Share of all completed.
	Requests int     `json:"requests"`
	Share    float64 `json:"share"`
	TTFTP50  float64 `json:"ttft_p50_s"`
	TTFTP90  float64 `json:"ttft_p90_s"`
	TPOTP50  float64 `json:"tpot_p50_s"`
	// Means of the predictions and of the actual values over the same
	// requests, those with a prediction; zero without predictions.
	PredictedTTFTMean float64 `json:"predicted_ttft_mean_s,omitempty"`
	ActualTTFTMean    float64 `json:"actual_ttft_mean_s,omitempty"`
	PredictedTPOTMean float64 `json:"predicted_tpot_mean_s,omitempty"`
	ActualTPOTMean    float64 `json:"actual_tpot_mean_s,omitempty"`
	// The TTFT MAPE over the same requests, and over those not joined
	// (PredictionSummary): which preset's speed is mislearned shows in
	// the second, a burst's joins in the gap between the two.
	TTFTMAPE          float64 `json:"ttft_mape,omitempty"`
	TTFTMAPENotJoined float64 `json:"ttft_mape_not_joined,omitempty"`
	// TPOTMAPE is the TPOT MAPE over the requests with a TPOT prediction
	// and two output tokens or more: the means above can be far apart
	// where the MAPE is not (a skewed TPOT's mean is not what MAPE fits).
	TPOTMAPE float64 `json:"tpot_mape,omitempty"`
	// TPOTCovered is the share of those requests whose TPOT was at most
	// the predicted quantile (the SLO checks' figure): at the quantile's
	// level (0.9 by default) when it is calibrated.
	TPOTCovered float64 `json:"tpot_quantile_covered,omitempty"`
	// The latency model's learned TTFT of a cluster.ReferencePrompt-token
	// prompt on an idle replica of the preset, and the engine's (zero
	// without a model).
	LearnedIdleTTFT float64 `json:"learned_idle_ttft_s,omitempty"`
	TrueIdleTTFT    float64 `json:"true_idle_ttft_s,omitempty"`
	// The same for the TPOT of one sequence decoding alone.
	LearnedLoneTPOT float64 `json:"learned_lone_tpot_s,omitempty"`
	TrueLoneTPOT    float64 `json:"true_lone_tpot_s,omitempty"`
}

// predictedTTFT is one point of the predicted-vs-actual scatter plot.
type predictedTTFT struct{ actual, predicted float64 }

// summarizeSLO is nil when no request carried the SLO.
func summarizeSLO(res *cluster.Result) *SLOSummary {
	slo := res.SLO
	if !slo.Active() {
		return nil
	}
	out := &SLOSummary{TTFT: slo.TTFT.Seconds(), TPOT: slo.TPOT.Seconds()}
	var ttft, tpot, both int
	for i := range res.Requests {
		r := &res.Requests[i]
		if !r.SLO {
			continue
		}
		out.Requests++
		if r.Err != "" {
			continue
		}
		okTTFT := slo.TTFT == 0 || r.TTFT <= slo.TTFT
		okTPOT := slo.TPOT == 0 || r.TPOT <= slo.TPOT
		if okTTFT {
			ttft++
		}
		if okTPOT {
			tpot++
		}
		if okTTFT && okTPOT {
			both++
		}
	}
	if out.Requests == 0 {
		return out
	}
	n := float64(out.Requests)
	out.TTFTMet, out.TPOTMet, out.BothMet = float64(ttft)/n, float64(tpot)/n, float64(both)/n
	return out
}

// meanPair accumulates predictions and the actual values they predicted.
type meanPair struct {
	n                 int
	pred, actual, ape float64
}

// add counts one prediction; an actual value of zero has no percentage
// error and is skipped.
func (m *meanPair) add(pred, actual float64) {
	if pred <= 0 || actual <= 0 {
		return
	}
	m.n++
	m.pred += pred
	m.actual += actual
	m.ape += math.Abs(pred-actual) / actual
}

func (m *meanPair) means() (pred, actual, mape float64) {
	if m.n == 0 {
		return 0, 0, 0
	}
	n := float64(m.n)
	return m.pred / n, m.actual / n, m.ape / n
}

// summarizeByPreset breaks a run down by preset and scores the
// predictions. The preset table is left out for a one-preset fleet without
// predictions, where it would repeat the policy's row.
func summarizeByPreset(res *cluster.Result) ([]PresetSummary, *PredictionSummary, []predictedTTFT) {
	type acc struct {
		ttft, tpot []float64
		predTTFT   meanPair
		predTPOT   meanPair
		notJoined  meanPair
		// covered counts the TPOT predictions whose quantile the actual
		// TPOT did not exceed.
		covered int
	}
	by := map[string]*acc{}
	var all acc
	var points []predictedTTFT
	completed := 0
	for i := range res.Requests {
		r := &res.Requests[i]
		if r.Err != "" {
			continue
		}
		completed++
		a := by[r.Preset]
		if a == nil {
			a = &acc{}
			by[r.Preset] = a
		}
		a.ttft = append(a.ttft, r.TTFT.Seconds())
		if r.OutputTokens > 1 {
			a.tpot = append(a.tpot, r.TPOT.Seconds())
		}
		// The picker predicts at its decision: a flow-control queue's
		// wait before it is not part of what it predicts.
		served := r.TTFT - r.Queued
		for _, x := range []*acc{a, &all} {
			x.predTTFT.add(r.PredictedTTFT.Seconds(), served.Seconds())
			x.predTPOT.add(r.PredictedTPOT.Seconds(), r.TPOT.Seconds())
			if r.PredictedTPOT > 0 && r.TPOT > 0 && r.TPOT <= r.PredictedTPOTQuantile {
				x.covered++
			}
			if !r.Joined {
				x.notJoined.add(r.PredictedTTFT.Seconds(), served.Seconds())
			}
		}
		if r.PredictedTTFT > 0 && served > 0 {
			points = append(points, predictedTTFT{actual: served.Seconds(), predicted: r.PredictedTTFT.Seconds()})
		}
	}
	var pred *PredictionSummary
	if all.predTTFT.n > 0 || all.predTPOT.n > 0 {
		_, _, ttft := all.predTTFT.means()
		_, _, tpot := all.predTPOT.means()
		_, _, alone := all.notJoined.means()
		pred = &PredictionSummary{TTFTRequests: all.predTTFT.n, TTFTMAPE: ttft, TPOTRequests: all.predTPOT.n, TPOTMAPE: tpot,
			TTFTNotJoinedRequests: all.notJoined.n, TTFTMAPENotJoined: alone}
	}
	if len(by) < 2 && pred == nil {
		return nil, nil, nil
	}
	var out []PresetSummary
	for name, a := range by {
		slices.Sort(a.ttft)
		slices.Sort(a.tpot)
		p := PresetSummary{Preset: name, Requests: len(a.ttft), Share: float64(len(a.ttft)) / float64(completed),
			TTFTP50: pct(a.ttft, 50), TTFTP90: pct(a.ttft, 90), TPOTP50: pct(a.tpot, 50)}
		p.PredictedTTFTMean, p.ActualTTFTMean, p.TTFTMAPE = a.predTTFT.means()
		_, _, p.TTFTMAPENotJoined = a.notJoined.means()
		p.PredictedTPOTMean, p.ActualTPOTMean, p.TPOTMAPE = a.predTPOT.means()
		if a.predTPOT.n > 0 {
			p.TPOTCovered = float64(a.covered) / float64(a.predTPOT.n)
		}
		for _, l := range res.Learned {
			if l.Preset == name {
				p.LearnedIdleTTFT, p.TrueIdleTTFT = l.IdleTTFT.Seconds(), l.TrueIdleTTFT.Seconds()
				p.LearnedLoneTPOT, p.TrueLoneTPOT = l.LoneTPOT.Seconds(), l.TrueLoneTPOT.Seconds()
			}
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b PresetSummary) int { return cmp.Compare(a.Preset, b.Preset) })
	return out, pred, points
}

// column is an optional column of the policy table.
type column struct {
	head string
	cell func(s *Summary) string
}

// optionalColumns are the SLO and prediction columns the results have data
// for.
func optionalColumns(r *Results) []column {
	var ttft, tpot, pred bool
	for i := range r.Policies {
		s := &r.Policies[i]
		if s.SLO != nil {
			ttft, tpot = ttft || s.SLO.TTFT > 0, tpot || s.SLO.TPOT > 0
		}
		pred = pred || s.Prediction != nil
	}
	share := func(f func(*SLOSummary) float64) func(*Summary) string {
		return func(s *Summary) string {
			if s.SLO == nil || s.SLO.Requests == 0 {
				return "–"
			}
			return fmt.Sprintf("%.3f", f(s.SLO))
		}
	}
	var cols []column
	if ttft || tpot {
		cols = append(cols, column{"SLO requests", func(s *Summary) string {
			if s.SLO == nil {
				return "0"
			}
			return fmt.Sprint(s.SLO.Requests)
		}})
	}
	if ttft {
		cols = append(cols, column{"TTFT SLO met", share(func(o *SLOSummary) float64 { return o.TTFTMet })})
	}
	if tpot {
		cols = append(cols, column{"TPOT SLO met", share(func(o *SLOSummary) float64 { return o.TPOTMet })})
	}
	if ttft && tpot {
		cols = append(cols, column{"both SLOs met", share(func(o *SLOSummary) float64 { return o.BothMet })})
	}
	if pred {
		mape := func(n func(*PredictionSummary) int, v func(*PredictionSummary) float64) func(*Summary) string {
			return func(s *Summary) string {
				if s.Prediction == nil || n(s.Prediction) == 0 {
					return "–"
				}
				return fmt.Sprintf("%.1f%%", 100*v(s.Prediction))
			}
		}
		cols = append(cols,
			column{"TTFT MAPE", mape(func(p *PredictionSummary) int { return p.TTFTRequests }, func(p *PredictionSummary) float64 { return p.TTFTMAPE })},
			column{"TPOT MAPE", mape(func(p *PredictionSummary) int { return p.TPOTRequests }, func(p *PredictionSummary) float64 { return p.TPOTMAPE })},
			column{"TTFT MAPE not joined", mape(func(p *PredictionSummary) int { return p.TTFTNotJoinedRequests }, func(p *PredictionSummary) float64 { return p.TTFTMAPENotJoined })})
	}
	return cols
}

// presetTables writes the per-preset breakdowns the results have data for.
func presetTables(b *strings.Builder, r *Results) {
	var mixed, pred bool
	for _, s := range r.Policies {
		mixed = mixed || len(s.Presets) > 1
		pred = pred || s.Prediction != nil
	}
	if mixed {
		b.WriteString("\nBy preset:\n\n| policy | qps scale | preset | requests | share | TTFT p50 s | TTFT p90 s | TPOT p50 ms |\n|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Policies {
			for _, p := range s.Presets {
				fmt.Fprintf(b, "| %s | %g | %s | %d | %.3f | %.3f | %.3f | %.1f |\n",
					s.Name, s.QPSScale, p.Preset, p.Requests, p.Share, p.TTFTP50, p.TTFTP90, p.TPOTP50*1000)
			}
		}
	}
	if pred {
		fmt.Fprintf(b, "\nPredicted vs actual latency by preset (means over the requests with a prediction; idle TTFT: a %d-token prompt on an idle replica; lone TPOT: one sequence of that context decoding alone; as learned and as the engine computes them):\n\n", cluster.ReferencePrompt)
		b.WriteString("" +
			"| policy | qps scale | preset | predicted TTFT s | actual TTFT s | TTFT MAPE | TTFT MAPE not joined | predicted TPOT ms | actual TPOT ms | TPOT MAPE | TPOT within its quantile | learned idle TTFT ms | true idle TTFT ms | learned lone TPOT ms | true lone TPOT ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Policies {
			if s.Prediction == nil {
				continue
			}
			for _, p := range s.Presets {
				fmt.Fprintf(b, "| %s | %g | %s | %.3f | %.3f | %.1f%% | %.1f%% | %.1f | %.1f | %.1f%% | %.3f | %s | %s | %s | %s |\n",
					s.Name, s.QPSScale, p.Preset, p.PredictedTTFTMean, p.ActualTTFTMean, 100*p.TTFTMAPE, 100*p.TTFTMAPENotJoined, p.PredictedTPOTMean*1000, p.ActualTPOTMean*1000, 100*p.TPOTMAPE, p.TPOTCovered,
					learned(p.LearnedIdleTTFT, 1000), learned(p.TrueIdleTTFT, 1000), learned(p.LearnedLoneTPOT, 1000), learned(p.TrueLoneTPOT, 1000))
			}
		}
	}
}

// learned formats a learned figure, "–" for a policy without a model.
func learned(v, scale float64) string {
	if v == 0 {
		return "–"
	}
	return strconv.FormatFloat(v*scale, 'f', 1, 64)
}

// predictionChart is the predicted-vs-actual TTFT scatter of one run, with
// the diagonal a perfect predictor would lie on.
func predictionChart(title string, points []predictedTTFT) plot.Chart {
	pts := plot.Series{Name: "requests", Points: true}
	hi := 0.0
	for _, p := range points {
		pts.X, pts.Y = append(pts.X, p.actual), append(pts.Y, p.predicted)
		hi = max(hi, p.actual, p.predicted)
	}
	diag := plot.Series{Name: "predicted = actual", X: []float64{0, hi}, Y: []float64{0, hi}}
	return plot.Chart{Title: "Predicted vs actual TTFT — " + title, XLabel: "actual TTFT s", YLabel: "predicted TTFT s", Series: []plot.Series{pts, diag}}
}

// predictionFile names a run's scatter plot after its label, keeping only
// characters safe in any file name.
func predictionFile(label string) string {
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(label) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.':
			b.WriteRune(c)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
	}
	return "ttft_predicted_" + strings.TrimSuffix(b.String(), "-") + ".png"
}
