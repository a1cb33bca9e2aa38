package benchmarks

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/plot"
)

// Summary is one policy's row in results.json.
type Summary struct {
	Name string `json:"name"`
	// QPSScale is the arrival-rate multiplier of the run; OfferedQPS the
	// resulting mean arrival rate.
	QPSScale   float64 `json:"qps_scale"`
	OfferedQPS float64 `json:"offered_qps"`
	// Requests completed; Failed were refused by the picker or the engine.
	Requests int `json:"requests"`
	Failed   int `json:"failed"`
	// Clipped prompts were cut to the model's context length.
	Clipped              int     `json:"clipped"`
	TTFTP50              float64 `json:"ttft_p50_s"`
	TTFTP90              float64 `json:"ttft_p90_s"`
	TTFTP99              float64 `json:"ttft_p99_s"`
	TTFTMean             float64 `json:"ttft_mean_s"`
	TPOTP50              float64 `json:"tpot_p50_s"`
	ThroughputOutputTokS float64 `json:"throughput_output_tok_s"`
	PrefixHitRatio       float64 `json:"prefix_hit_ratio"`
	MaxQueueImbalance    int     `json:"max_queue_imbalance"`
	Stages               []Stage `json:"stages,omitempty"`
	// SLO is attainment when requests carried an SLO; Prediction the
	// picker's accuracy when it predicted latencies; Presets a breakdown
	// by preset for a mixed fleet or when there are predictions.
	SLO        *SLOSummary        `json:"slo,omitempty"`
	Prediction *PredictionSummary `json:"prediction,omitempty"`
	Presets    []PresetSummary    `json:"presets,omitempty"`
	// Classes break the run down by traffic class when requests named
	// InferenceObjectives (the mixed workload).
	Classes []ClassSummary `json:"classes,omitempty"`
	// Job is the async batch job's outcome (--async-job).
	Job              *JobSummary `json:"async_job,omitempty"`
	ttfts            []float64
	predTTFT         []predictedTTFT
	wall             time.Duration
	simulatedSeconds float64
}

// Stage summarises the requests offered at one rate of a load ramp (stages
// with equal rates are merged).
type Stage struct {
	OfferedQPS           float64 `json:"offered_qps"`
	Requests             int     `json:"requests"`
	TTFTP50              float64 `json:"ttft_p50_s"`
	TTFTP90              float64 `json:"ttft_p90_s"`
	ThroughputOutputTokS float64 `json:"throughput_output_tok_s"`
}

// Results is results.json.
type Results struct {
	Workload string    `json:"workload"`
	Replicas int       `json:"replicas"`
	Preset   string    `json:"preset"`
	Seed     uint64    `json:"seed"`
	Policies []Summary `json:"policies"`
}

// Summarize reduces one run to its Summary. Percentiles are nearest-rank.
func Summarize(name string, qpsScale float64, res *cluster.Result) Summary {
	s := Summary{Name: name, QPSScale: qpsScale, MaxQueueImbalance: res.MaxQueueImbalance, Clipped: res.Clipped}
	var tpots []float64
	var prompt, cached, output int64
	first, last := time.Duration(math.MaxInt64), time.Duration(0)
	type stageAcc struct {
		ttft  []float64
		first time.Duration
		n     int
		out   int64 // output tokens of requests finishing in the stage
	}
	stages := map[float64]*stageAcc{}
	for i := range res.Requests {
		r := &res.Requests[i]
		first = min(first, r.Arrival)
		last = max(last, r.Arrival)
		if r.Err != "" {
			s.Failed++
			continue
		}
		s.Requests++
		t := r.TTFT.Seconds()
		s.ttfts = append(s.ttfts, t)
		if r.OutputTokens > 1 {
			tpots = append(tpots, r.TPOT.Seconds())
		}
		prompt += int64(r.PromptTokens)
		cached += int64(r.CachedTokens)
		output += int64(r.OutputTokens)
		if r.OfferedQPS > 0 {
			a := stages[r.OfferedQPS]
			if a == nil {
				a = &stageAcc{first: r.Arrival}
				stages[r.OfferedQPS] = a
			}
			a.ttft = append(a.ttft, t)
			a.first = min(a.first, r.Arrival)
			a.n++
		}
	}
	slices.Sort(s.ttfts)
	slices.Sort(tpots)
	s.TTFTP50, s.TTFTP90, s.TTFTP99 = pct(s.ttfts, 50), pct(s.ttfts, 90), pct(s.ttfts, 99)
	s.TTFTMean = mean(s.ttfts)
	s.TPOTP50 = pct(tpots, 50)
	if prompt > 0 {
		s.PrefixHitRatio = float64(cached) / float64(prompt)
	}
	if span := (res.End - first).Seconds(); span > 0 && first <= res.End {
		s.ThroughputOutputTokS = float64(output) / span
		s.simulatedSeconds = span
	}
	if arr := (last - first).Seconds(); arr > 0 {
		s.OfferedQPS = float64(len(res.Requests)-1) / arr
	}
	keys := make([]float64, 0, len(stages))
	for k := range stages {
		keys = append(keys, k)
	}
	// Stages follow one another in time; a stage's window runs from its
	// first arrival to the next stage's (the last one's to the last arrival),
	// and its throughput is what the servers delivered in that window:
	// output tokens of requests finishing then, whichever stage they came
	// from.
	sort.Slice(keys, func(i, j int) bool { return stages[keys[i]].first < stages[keys[j]].first })
	ends := make([]time.Duration, len(keys))
	for i := range keys {
		ends[i] = last
		if i+1 < len(keys) {
			ends[i] = stages[keys[i+1]].first
		}
	}
	for i := range res.Requests {
		r := &res.Requests[i]
		if r.Err != "" {
			continue
		}
		done := r.Arrival + r.E2E
		for k, key := range keys {
			if a := stages[key]; done >= a.first && done < ends[k] {
				a.out += int64(r.OutputTokens)
				break
			}
		}
	}
	for k, key := range keys {
		a := stages[key]
		slices.Sort(a.ttft)
		st := Stage{OfferedQPS: key, Requests: a.n, TTFTP50: pct(a.ttft, 50), TTFTP90: pct(a.ttft, 90)}
		if d := (ends[k] - a.first).Seconds(); d > 0 {
			st.ThroughputOutputTokS = float64(a.out) / d
		}
		s.Stages = append(s.Stages, st)
	}
	s.SLO = summarizeSLO(res)
	s.Classes = summarizeClasses(res)
	s.Job = summarizeJob(res)
	s.Presets, s.Prediction, s.predTTFT = summarizeByPreset(res)
	return s
}

func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t / float64(len(v))
}

// writeResults writes results.json (a pure function of the inputs and the
// seed), results.md (with wall times) and the plots into dir.
func writeResults(dir string, r *Results) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(Markdown(r)), 0o644); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	return writePlots(dir, r)
}

// Markdown renders the results as a table, one row per policy and scale.
func Markdown(r *Results) string {
	var b strings.Builder
	fleet := fmt.Sprintf("%d × %s", r.Replicas, r.Preset)
	if strings.Contains(r.Preset, ":") {
		fleet = fmt.Sprintf("%d replicas (%s)", r.Replicas, r.Preset)
	}
	fmt.Fprintf(&b, "%s on %s, seed %d\n\n", r.Workload, fleet, r.Seed)
	extra := optionalColumns(r)
	b.WriteString("| policy | qps scale | offered QPS | requests | failed | TTFT p50 s | TTFT p90 s | TTFT p99 s | TTFT mean s | TPOT p50 ms | output tok/s | prefix hit | max queue imbalance | wall s |")
	for _, c := range extra {
		b.WriteString(" " + c.head + " |")
	}
	b.WriteString("\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + strings.Repeat("---|", len(extra)) + "\n")
	for i := range r.Policies {
		s := &r.Policies[i]
		fmt.Fprintf(&b, "| %s | %g | %.2f | %d | %d | %.3f | %.3f | %.3f | %.3f | %.1f | %.0f | %.3f | %d | %.1f |",
			s.Name, s.QPSScale, s.OfferedQPS, s.Requests, s.Failed, s.TTFTP50, s.TTFTP90, s.TTFTP99, s.TTFTMean,
			s.TPOTP50*1000, s.ThroughputOutputTokS, s.PrefixHitRatio, s.MaxQueueImbalance, s.wall.Seconds())
		for _, c := range extra {
			b.WriteString(" " + c.cell(s) + " |")
		}
		b.WriteString("\n")
	}
	presetTables(&b, r)
	classTable(&b, r)
	jobTable(&b, r)
	return b.String()
}

func writePlots(dir string, r *Results) error {
	var cdf []plot.Series
	byName := map[string]*[2]plot.Series{} // TTFT p90 and throughput vs QPS
	var order []string
	charts := map[string]plot.Chart{}
	scales := map[float64]bool{}
	for _, s := range r.Policies {
		scales[s.QPSScale] = true
	}
	sweep := len(scales) > 1
	for _, s := range r.Policies {
		name := s.Name
		if sweep {
			name = fmt.Sprintf("%s ×%g", s.Name, s.QPSScale)
		}
		if len(s.predTTFT) > 0 {
			charts[predictionFile(name)] = predictionChart(name+" — "+r.Workload, s.predTTFT)
		}
		if len(s.ttfts) > 0 && (!sweep || len(cdf) < 8) {
			ser := plot.Series{Name: name}
			for _, p := range quantileGrid {
				ser.X = append(ser.X, p)
				ser.Y = append(ser.Y, pct(s.ttfts, p))
			}
			cdf = append(cdf, ser)
		}
		v := byName[s.Name]
		if v == nil {
			v = &[2]plot.Series{{Name: s.Name}, {Name: s.Name}}
			byName[s.Name] = v
			order = append(order, s.Name)
		}
		if sweep {
			v[0].X, v[0].Y = append(v[0].X, s.OfferedQPS), append(v[0].Y, s.TTFTP90)
			v[1].X, v[1].Y = append(v[1].X, s.OfferedQPS), append(v[1].Y, s.ThroughputOutputTokS)
		} else {
			for _, st := range s.Stages {
				v[0].X, v[0].Y = append(v[0].X, st.OfferedQPS), append(v[0].Y, st.TTFTP90)
				v[1].X, v[1].Y = append(v[1].X, st.OfferedQPS), append(v[1].Y, st.ThroughputOutputTokS)
			}
		}
	}
	if len(cdf) > 0 {
		charts["ttft_cdf.png"] = plot.Chart{Title: "TTFT by percentile — " + r.Workload, XLabel: "percentile of requests", YLabel: "TTFT s", LogY: true, Series: cdf}
	}
	var ttft, tput []plot.Series
	for _, n := range order {
		if v := byName[n]; len(v[0].X) > 1 {
			ttft, tput = append(ttft, v[0]), append(tput, v[1])
		}
	}
	if len(ttft) > 0 {
		charts["ttft_vs_qps.png"] = plot.Chart{Title: "p90 TTFT vs offered load — " + r.Workload, XLabel: "offered QPS", YLabel: "p90 TTFT s", LogY: true, Series: ttft}
		charts["throughput_vs_qps.png"] = plot.Chart{Title: "Output throughput vs offered load — " + r.Workload, XLabel: "offered QPS", YLabel: "output tok/s", Series: tput}
	}
	names := make([]string, 0, len(charts))
	for n := range charts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		var buf bytes.Buffer
		if err := charts[n].PNG(&buf); err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), buf.Bytes(), 0o644); err != nil {
			return fmt.Errorf("writing plot: %w", err)
		}
	}
	return nil
}

// quantileGrid is where the TTFT curve is sampled: finely in the tail,
// where policies differ most.
var quantileGrid = func() []float64 {
	var g []float64
	for p := 1.0; p < 90; p += 1 {
		g = append(g, p)
	}
	for p := 90.0; p <= 100; p += 0.25 {
		g = append(g, p)
	}
	return g
}()
