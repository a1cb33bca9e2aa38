package benchmarks

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/autoscale"
	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/plot"
	"github.com/kvgate/kvgate/benchmarks/workload"
)

// AutoscaleOptions are the --autoscale flags: scaling policies compared on
// one workload, the fleet resized during each run.
type AutoscaleOptions struct {
	// Policies is a comma-separated list of autoscale.PolicyNames; empty
	// runs the routing comparison instead.
	Policies       string
	Min, Max       int
	Fixed          int
	StartupDelay   time.Duration
	Interval       time.Duration
	PeakPrefillTPS float64
	// RateProfile varies the workload's pace per --stage-duration stage.
	RateProfile string
}

func (a *AutoscaleOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&a.Policies, "autoscale", a.Policies, "scaling policies to compare on a resizing fleet ("+strings.Join(autoscale.PolicyNames, ",")+"); the fleet starts at --autoscale-min, \"fixed\" runs --fixed-replicas")
	fs.IntVar(&a.Min, "autoscale-min", 1, "autoscale: minReplicaCount")
	fs.IntVar(&a.Max, "autoscale-max", 8, "autoscale: maxReplicaCount")
	fs.IntVar(&a.Fixed, "fixed-replicas", 0, "autoscale: the fixed fleet's size (0: --autoscale-max, the fleet sized for the peak)")
	fs.DurationVar(&a.StartupDelay, "startup-delay", cluster.DefaultStartupDelay, "autoscale: a new replica's time from creation to serving (it holds its GPU meanwhile)")
	fs.DurationVar(&a.Interval, "scale-interval", cluster.DefaultScaleInterval, "autoscale: the HPA's sync period")
	fs.StringVar(&a.RateProfile, "rate-profile", "", "autoscale: replay the workload (e.g. --trace) at these factors of its own rate, one per --stage-duration (e.g. 0.5,1,2,1,0.5: a stepped load with the trace's request mix)")
	fs.Float64Var(&a.PeakPrefillTPS, "peak-prefill-throughput", autoscale.PeakPrefillThroughput, "autoscale: token-aware divisor (tokens/s of one replica's prefill)")
}

// check validates the autoscale flags against the rest.
func (a AutoscaleOptions) check(o Options, pl plan) error {
	if a.Policies == "" {
		return nil
	}
	if a.RateProfile != "" {
		if _, err := floats(a.RateProfile); err != nil {
			return fmt.Errorf("--rate-profile: %v", err)
		}
	}
	if len(pl.pols) != 1 {
		return errors.New("--autoscale needs exactly one routing policy in --policies")
	}
	if pl.mixed != nil {
		return errors.New("--autoscale scales one preset: use --preset")
	}
	if o.Sweep != "" {
		return errors.New("--autoscale does not sweep: give one --qps-scale")
	}
	for _, n := range a.names() {
		if _, err := autoscale.NewPolicy(n, a.policyOptions()); err != nil {
			return err
		}
		if n == "slo" && !o.slo().Active() {
			return errors.New("--autoscale slo needs --slo-ttft or --slo-tpot")
		}
	}
	return nil
}

func (a AutoscaleOptions) names() []string {
	var out []string
	for _, n := range strings.Split(a.Policies, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func (a AutoscaleOptions) policyOptions() autoscale.Options {
	fixed := a.Fixed
	if fixed == 0 {
		fixed = a.Max
	}
	return autoscale.Options{Bounds: autoscale.Bounds{Min: a.Min, Max: a.Max}, Fixed: fixed, PeakPrefillThroughput: a.PeakPrefillTPS}
}

// ScalingSummary is one scaling policy's run.
type ScalingSummary struct {
	Policy   string      `json:"policy"`
	Requests int         `json:"requests"`
	Failed   int         `json:"failed"`
	SLO      *SLOSummary `json:"slo,omitempty"`
	TTFTP90  float64     `json:"ttft_p90_s"`
	TPOTP90  float64     `json:"tpot_p90_s"`
	// GPUHours is the replicas' GPU time (start-up and draining
	// included); MeanReplicas that over the run's length.
	GPUHours     float64 `json:"gpu_hours"`
	MeanReplicas float64 `json:"mean_replicas"`
	PeakReplicas int     `json:"peak_replicas"`
	// Events are the changes of spec.replicas.
	Events   []cluster.ScaleEvent `json:"events"`
	Timeline []cluster.ScalePoint `json:"timeline"`
	End      float64              `json:"end_s"`
}

// AutoscaleResults is a comparison of scaling policies.
type AutoscaleResults struct {
	Workload     string           `json:"workload"`
	Preset       string           `json:"preset"`
	Routing      string           `json:"routing_policy"`
	Seed         uint64           `json:"seed"`
	StartupDelay float64          `json:"startup_delay_s"`
	Bounds       autoscale.Bounds `json:"bounds"`
	Policies     []ScalingSummary `json:"policies"`
	// Offered is the workload's arrival rate per minute, for the plot.
	Offered []float64 `json:"offered_qps_per_minute"`
}

// scaler adapts an autoscale.Policy to the simulation: it turns the fleet
// state into the values the ScaledObject triggers read, with the SLO
// signal kept as its recording rules keep it.
type scaler struct {
	policy autoscale.Policy
	slo    autoscale.SLOSignal
}

func (s *scaler) Scale(st cluster.FleetState) (int, error) {
	// The rules prefer the predicted histograms when the picker predicts.
	if len(st.Predicted) > 0 {
		for _, p := range st.Predicted {
			s.slo.Observe(st.Now, p.TTFT, p.TPOT)
		}
	} else {
		for _, r := range st.Finished {
			if r.Err == "" {
				s.slo.Observe(st.Now, r.TTFT, r.TPOT)
			}
		}
	}
	sig := autoscale.Signals{
		Now: st.Now, Replicas: st.Replicas, Ready: st.Ready,
		QueueSize: float64(st.Queue), Running: float64(st.Running), PoolSaturation: st.PoolSaturation,
		InflightTokens: st.InflightTokens, KVUsage: st.KVUsage, GPUUtil: st.GPUUtil,
	}
	if s.slo.TTFT > 0 || s.slo.TPOT > 0 {
		sig.SLOSaturation = s.slo.Evaluate(st.Now)
	}
	return s.policy.Decide(sig)
}

// runAutoscale runs every scaling policy on the workload and writes
// autoscale.json, autoscale.md and autoscale-replicas.png.
func runAutoscale(ctx context.Context, o Options, pl plan, stderr io.Writer) error {
	reqs, name, err := o.load()
	if err != nil {
		return err
	}
	reqs = workload.ScaleQPS(reqs, o.QPSScale)
	a := o.Autoscale
	if a.RateProfile != "" {
		factors, _ := floats(a.RateProfile) // checked by check
		if reqs, err = workload.Reshape(reqs, factors, o.StageDuration); err != nil {
			return err
		}
		if len(reqs) == 0 {
			return errors.New("--rate-profile leaves no requests")
		}
		name += fmt.Sprintf(", rate ×%s per %v", a.RateProfile, o.StageDuration)
	}
	reqs = workload.QuantizeArrivals(reqs, o.ArrivalQuantum)
	route := pl.pols[0]
	out := &AutoscaleResults{Workload: name, Preset: pl.preset.Name, Routing: route.Name, Seed: o.Seed,
		StartupDelay: a.StartupDelay.Seconds(), Bounds: autoscale.Bounds{Min: a.Min, Max: a.Max}, Offered: perMinute(reqs)}
	fmt.Fprintf(stderr, "%s: %d requests; routing %s; scaling %s\n", name, len(reqs), route.Name, a.Policies)
	for _, n := range a.names() {
		pol, err := autoscale.NewPolicy(n, a.policyOptions())
		if err != nil {
			return err
		}
		sc := &scaler{policy: pol, slo: autoscale.SLOSignal{TTFT: o.SLOTTFT, TPOT: o.SLOTPOT}}
		co := o.clusterOptions(pl, slog.New(slog.DiscardHandler))
		co.Replicas = a.Min
		if n == "fixed" {
			co.Replicas = a.policyOptions().Fixed
		}
		co.Scaling = cluster.Scaling{Scaler: sc, Interval: a.Interval, StartupDelay: a.StartupDelay, MaxReplicas: max(a.Max, co.Replicas)}
		wall := time.Now()
		res, err := cluster.Run(ctx, co, route, reqs)
		if err != nil {
			return fmt.Errorf("autoscale %s: %w", n, err)
		}
		s := summarizeScaling(n, res)
		out.Policies = append(out.Policies, s)
		att := "-"
		if s.SLO != nil {
			att = fmt.Sprintf("%.1f%%", 100*s.SLO.BothMet)
		}
		fmt.Fprintf(stderr, "%-12s SLO met %6s  GPU-hours %6.3f  mean replicas %5.2f  peak %2d  events %3d  wall %.1fs\n",
			n, att, s.GPUHours, s.MeanReplicas, s.PeakReplicas, len(s.Events), time.Since(wall).Seconds())
	}
	if err := writeAutoscale(o.Out, out); err != nil {
		return err
	}
	fmt.Fprint(stderr, "\n", AutoscaleMarkdown(out))
	return nil
}

func summarizeScaling(name string, res *cluster.Result) ScalingSummary {
	sum := Summarize(name, 1, res)
	s := ScalingSummary{Policy: name, Requests: sum.Requests, Failed: sum.Failed, SLO: summarizeSLO(res),
		TTFTP90: sum.TTFTP90, GPUHours: res.GPUSeconds / 3600, Events: res.Scaling.Events, Timeline: res.Scaling.Timeline,
		End: res.End.Seconds()}
	var tpots []float64
	for _, r := range res.Requests {
		if r.Err == "" && r.TPOT > 0 {
			tpots = append(tpots, r.TPOT.Seconds())
		}
	}
	slices.Sort(tpots)
	s.TPOTP90 = pct(tpots, 90)
	if res.End > 0 {
		s.MeanReplicas = res.GPUSeconds / res.End.Seconds()
	}
	for _, p := range res.Scaling.Timeline {
		s.PeakReplicas = max(s.PeakReplicas, p.Replicas)
	}
	return s
}

// perMinute is the arrival rate in each minute of the workload.
func perMinute(reqs []workload.Request) []float64 {
	var out []float64
	for _, r := range reqs {
		m := int(r.Arrival / time.Minute)
		for len(out) <= m {
			out = append(out, 0)
		}
		out[m] += 1.0 / 60
	}
	return out
}

// AutoscaleMarkdown renders the comparison.
func AutoscaleMarkdown(r *AutoscaleResults) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s on %s (routing %s, seed %d); replicas %d..%d, start-up %gs\n\n",
		r.Workload, r.Preset, r.Routing, r.Seed, r.Bounds.Min, r.Bounds.Max, r.StartupDelay)
	b.WriteString("| scaling | requests | failed | SLO met (both) | TTFT met | TPOT met | TTFT p90 s | TPOT p90 ms | GPU-hours | mean replicas | peak | scaling events |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Policies {
		both, ttft, tpot := "-", "-", "-"
		if s.SLO != nil {
			both, ttft, tpot = fmt.Sprintf("%.1f%%", 100*s.SLO.BothMet), fmt.Sprintf("%.1f%%", 100*s.SLO.TTFTMet), fmt.Sprintf("%.1f%%", 100*s.SLO.TPOTMet)
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %.3f | %.1f | %.3f | %.2f | %d | %d |\n",
			s.Policy, s.Requests, s.Failed, both, ttft, tpot, s.TTFTP90, s.TPOTP90*1000, s.GPUHours, s.MeanReplicas, s.PeakReplicas, len(s.Events))
	}
	return b.String()
}

func writeAutoscale(dir string, r *AutoscaleResults) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "autoscale.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "autoscale.md"), []byte(AutoscaleMarkdown(r)), 0o644); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, "autoscale-replicas.png"))
	if err != nil {
		return err
	}
	if err := replicaChart(r).PNG(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// replicaChart plots each policy's replica count over time as a step line,
// with the offered load (requests/s, per minute) beside it.
func replicaChart(r *AutoscaleResults) plot.Chart {
	c := plot.Chart{Title: "replicas over time — " + r.Workload, XLabel: "time (min)", YLabel: "replicas; offered req/s"}
	for _, s := range r.Policies {
		if len(s.Timeline) == 0 {
			continue
		}
		var x, y []float64
		for i, p := range s.Timeline {
			if i > 0 {
				x, y = append(x, p.At.Minutes()), append(y, y[len(y)-1])
			}
			x, y = append(x, p.At.Minutes()), append(y, float64(p.Replicas))
		}
		x, y = append(x, s.End/60), append(y, y[len(y)-1])
		c.Series = append(c.Series, plot.Series{Name: s.Policy, X: x, Y: y})
	}
	var x, y []float64
	for i, q := range r.Offered {
		x, y = append(x, float64(i)+0.5), append(y, q)
	}
	c.Series = append(c.Series, plot.Series{Name: "offered req/s", X: x, Y: y, Points: true})
	return c
}
