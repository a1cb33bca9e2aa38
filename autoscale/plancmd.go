package autoscale

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/sim/engine"
)

// ErrUsage reports bad command-line arguments; the usage text has been
// written.
var ErrUsage = errors.New("usage")

type variantFlags []Variant

func (v *variantFlags) String() string { return fmt.Sprint(len(*v), " variants") }

// Set parses name=…,preset=…,cost=…[,accelerator=…][,max=…].
func (v *variantFlags) Set(s string) error {
	x := Variant{Max: 16}
	for _, kv := range strings.Split(s, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return fmt.Errorf("variant %q: %q is not key=value", s, kv)
		}
		switch k {
		case "name":
			x.Name = val
		case "preset":
			p, ok := engine.LookupPreset(val)
			if !ok {
				return fmt.Errorf("variant %q: unknown preset %q", s, val)
			}
			x.Preset = p
		case "cost":
			c, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return fmt.Errorf("variant %q: cost: %w", s, err)
			}
			x.Cost = c
		case "accelerator":
			x.Accelerator = val
		case "max":
			n, err := strconv.Atoi(val)
			if err != nil {
				return fmt.Errorf("variant %q: max: %w", s, err)
			}
			x.Max = n
		default:
			return fmt.Errorf("variant %q: unknown key %q (name, preset, cost, accelerator, max)", s, k)
		}
	}
	if x.Preset.Name == "" {
		return fmt.Errorf("variant %q: preset is required", s)
	}
	if x.Name == "" {
		x.Name = x.Preset.Name
	}
	if x.Accelerator == "" {
		x.Accelerator = x.Preset.GPU.Name
	}
	*v = append(*v, x)
	return nil
}

type currentFlags map[string]int

func (c currentFlags) String() string { return fmt.Sprint(map[string]int(c)) }

func (c currentFlags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	n, err := strconv.Atoi(v)
	if !ok || err != nil || n < 0 {
		return fmt.Errorf("--current %q: want variant=replicas", s)
	}
	c[k] = n
	return nil
}

// PlanOutput is `kvgate plan`'s JSON on stdout.
type PlanOutput struct {
	Demand   Demand           `json:"demand"`
	Variants []PlannedVariant `json:"variants"`
	// CostPerHour is the mix's price; Met the share of requests that met
	// the SLOs on the simulated fleet.
	CostPerHour float64 `json:"cost_per_hour"`
	Met         float64 `json:"slo_attainment"`
	TTFTP90     float64 `json:"ttft_p90_s"`
	TPOTP90     float64 `json:"tpot_p90_s"`
	Simulated   int     `json:"mixes_simulated"`
	// LatencyModel is the plan made on the picker's latency model
	// (--latency-model); nil without it.
	LatencyModel *ModelPlanOutput `json:"latency_model,omitempty"`
}

// ModelPlanOutput is --latency-model's part of the output: the mix the
// latency model chose, what the model and the simulation say of it, and
// what the model learned of each preset.
type ModelPlanOutput struct {
	Desired map[string]int `json:"desired_replicas"`
	// MetOnModel and MetSimulated are the mix's SLO attainment on the
	// model and on the simulated fleet; Agree that the simulation meets
	// the target too (else the plan above is the simulation planner's).
	MetOnModel   float64 `json:"slo_attainment_on_model"`
	MetSimulated float64 `json:"slo_attainment_simulated"`
	Agree        bool    `json:"agree"`
	// Calibration is the fleet the model was fitted on.
	Calibration string          `json:"calibration"`
	Learned     []LearnedPreset `json:"learned"`
}

// LearnedPreset is the model's fit of one preset.
type LearnedPreset struct {
	Preset                 string  `json:"preset"`
	PrefillTokensPerSecond float64 `json:"prefill_tokens_per_second"`
	LoneTPOT               float64 `json:"lone_tpot_s"`
}

// PlannedVariant is one variant's share of the plan.
type PlannedVariant struct {
	Name        string  `json:"variant_name"`
	Accelerator string  `json:"accelerator_type"`
	Cost        float64 `json:"cost_per_hour"`
	Desired     int     `json:"desired_replicas"`
	// Alone is the smallest fleet of this variant alone meeting the SLOs.
	Alone int `json:"alone_replicas"`
}

// PlanMain is `kvgate plan`. args exclude the subcommand name.
func PlanMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvgate plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		variants           variantFlags
		current            = currentFlags{}
		slo                SLOTarget
		rate               float64
		duration, window   time.Duration
		prompt, output     int
		trace, prom, sel   string
		qpsScale           float64
		routing, namespace string
		metricsOut, listen string
		seed               uint64
		onModel            bool
	)
	fs.Var(&variants, "variant", "a variant: name=…,preset=…,cost=…(per replica-hour)[,accelerator=…][,max=16] (repeatable)")
	fs.DurationVar(&slo.TTFT, "slo-ttft", 0, "TTFT objective")
	fs.DurationVar(&slo.TPOT, "slo-tpot", 0, "TPOT objective")
	fs.Float64Var(&slo.Attainment, "attainment", 0.95, "share of requests that must meet every objective")
	fs.Float64Var(&rate, "rate", 0, "offered load: requests/s (Poisson, unique prompts of --prompt-tokens, --output-tokens)")
	fs.IntVar(&prompt, "prompt-tokens", 1000, "--rate: prompt tokens per request")
	fs.IntVar(&output, "output-tokens", 200, "--rate: output tokens per request")
	fs.DurationVar(&duration, "duration", 3*time.Minute, "--rate, --prometheus: simulated time of the offered load")
	fs.StringVar(&trace, "trace", "", "offered load: a Mooncake trace (JSON lines)")
	fs.Float64Var(&qpsScale, "qps-scale", 1, "--trace: multiply its arrival rate")
	fs.StringVar(&prom, "prometheus", "", "offered load: the live fleet's measured demand from this Prometheus (base URL)")
	fs.DurationVar(&window, "window", 10*time.Minute, "--prometheus: the rate window")
	fs.StringVar(&sel, "selector", "", `--prometheus: label selector for the picker's series, e.g. {namespace="llm-d"}`)
	fs.StringVar(&routing, "routing", config.PolicyLoad, "the picker's routing policy: "+strings.Join(config.PolicyNames, " | "))
	fs.Uint64Var(&seed, "seed", 1, "seed of the load and the simulation")
	fs.StringVar(&namespace, "namespace", "default", "namespace label of the wva_* metrics")
	fs.Var(current, "current", "a variant's current replicas, variant=n, for wva_current_replicas and wva_desired_ratio (repeatable)")
	fs.StringVar(&metricsOut, "metrics-out", "", "write the wva_* metrics in the Prometheus text format to this file")
	fs.BoolVar(&onModel, "latency-model", false, "plan on the picker's latency model fitted to the --current fleet serving the offered load (without --current: a ramp on one replica per variant), then check the answer in the simulation")
	fs.StringVar(&listen, "listen", "", "after planning, serve the wva_* metrics on http://ADDR/metrics until interrupted")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	usage := func(err error) error {
		fmt.Fprintln(stderr, err)
		fs.Usage()
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	sources := 0
	for _, set := range []bool{rate > 0, trace != "", prom != ""} {
		if set {
			sources++
		}
	}
	if sources != 1 {
		return usage(errors.New("give exactly one offered load: --rate, --trace or --prometheus"))
	}
	if len(variants) == 0 {
		return usage(errors.New("give at least one --variant"))
	}
	for name := range current {
		found := false
		for _, v := range variants {
			found = found || v.Name == name
		}
		if !found {
			return usage(fmt.Errorf("--current names unknown variant %q", name))
		}
	}
	raw, err := config.Policy(routing, config.PolicyOptions{BlockSize: kvhash.DefaultBlockSize, HashSeed: kvhash.DefaultSeed})
	if err != nil {
		return usage(err)
	}
	var d Demand
	var reqs []workload.Request
	switch {
	case prom != "":
		d, err = MeasuredDemand(ctx, &http.Client{Timeout: 30 * time.Second}, strings.TrimRight(prom, "/"), window, sel)
		if err != nil {
			return err
		}
		rate, prompt, output = d.Rate, int(d.PromptTokens+0.5), int(d.OutputTokens+0.5)
		fallthrough
	case rate > 0:
		d = Demand{Rate: rate, PromptTokens: float64(prompt), OutputTokens: float64(output)}
		sp := workload.SharedPrefix{Groups: 1, SuffixTokens: prompt, OutputTokens: output, Stages: []workload.Stage{{QPS: rate, Duration: duration}}}
		if reqs, err = sp.Generate(seed); err != nil {
			return usage(err)
		}
	default:
		f, err := os.Open(trace)
		if err != nil {
			return fmt.Errorf("trace: %w", err)
		}
		reqs, err = workload.LoadMooncake(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", trace, err)
		}
		reqs = workload.ScaleQPS(reqs, qpsScale)
		st := workload.Summarize(reqs)
		if n := float64(st.Requests); n > 0 && st.Duration > 0 {
			d = Demand{Rate: n / st.Duration.Seconds(), PromptTokens: float64(st.PromptTokens) / n, OutputTokens: float64(st.OutputTokens) / n}
		}
	}
	p := &Planner{Variants: variants, SLO: slo, Requests: reqs, Routing: cluster.Policy{Name: routing, Config: raw}, Seed: seed}
	fmt.Fprintf(stderr, "planning for %.2f req/s (%.0f prompt, %.0f output tokens per request), %d requests simulated per mix\n",
		d.Rate, d.PromptTokens, d.OutputTokens, len(reqs))
	var plan *Plan
	var modelOut *ModelPlanOutput
	if onModel {
		if plan, modelOut, err = planOnModel(ctx, p, current, stderr); err != nil {
			return err
		}
	} else if plan, err = p.Plan(ctx); err != nil {
		return err
	}
	out := PlanOutput{Demand: d, CostPerHour: plan.Best.Mix.Cost(variants), Met: plan.Best.Met,
		TTFTP90: plan.Best.TTFTP90.Seconds(), TPOTP90: plan.Best.TPOTP90.Seconds(), Simulated: plan.Simulated, LatencyModel: modelOut}
	for i, v := range variants {
		out.Variants = append(out.Variants, PlannedVariant{Name: v.Name, Accelerator: v.Accelerator, Cost: v.Cost, Desired: plan.Best.Mix[i], Alone: plan.Alone[i]})
		fmt.Fprintf(stderr, "  %-24s %-16s $%.2f/h  desired %d  (alone %d)\n", v.Name, v.Accelerator, v.Cost, plan.Best.Mix[i], plan.Alone[i])
	}
	fmt.Fprintf(stderr, "cost $%.2f/h, SLO attainment %.1f%%, p90 TTFT %.3fs, p90 TPOT %.1fms; %d mixes simulated\n",
		out.CostPerHour, 100*out.Met, out.TTFTP90, 1000*out.TPOTP90, out.Simulated)
	js, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "%s\n", js); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	if err := RegisterWVA(reg, namespace, out.Variants, current); err != nil {
		return err
	}
	if metricsOut != "" {
		if err := writeMetrics(reg, metricsOut); err != nil {
			return err
		}
	}
	if listen != "" {
		return serveMetrics(ctx, reg, listen, stderr)
	}
	return nil
}

// planOnModel is --latency-model: fit, plan on the model, check in the
// simulation.
func planOnModel(ctx context.Context, p *Planner, current map[string]int, stderr io.Writer) (*Plan, *ModelPlanOutput, error) {
	cur := make(Mix, len(p.Variants))
	calib := "a ramp to the offered rate on one replica of each preset"
	if len(current) > 0 {
		var parts []string
		for i, v := range p.Variants {
			cur[i] = current[v.Name]
			parts = append(parts, fmt.Sprintf("%d × %s", cur[i], v.Name))
		}
		calib = "the current fleet (" + strings.Join(parts, ", ") + ") at the offered load"
	}
	m, err := p.FitModel(ctx, cur)
	if err != nil {
		return nil, nil, err
	}
	mp, err := p.PlanOnModel(ctx, m)
	if err != nil {
		return nil, nil, err
	}
	out := &ModelPlanOutput{Desired: map[string]int{}, MetOnModel: mp.OnModel.Best.Met, MetSimulated: mp.Checked.Met, Agree: mp.Agree, Calibration: calib}
	for i, v := range p.Variants {
		out.Desired[v.Name] = mp.OnModel.Best.Mix[i]
	}
	for _, f := range m.Fits() {
		out.Learned = append(out.Learned, LearnedPreset{Preset: f.Address, PrefillTokensPerSecond: f.PrefillTokensPerSecond, LoneTPOT: f.DecodeStep.Seconds()})
	}
	slices.SortFunc(out.Learned, func(a, b LearnedPreset) int { return strings.Compare(a.Preset, b.Preset) })
	verdict := "the simulation agrees"
	if !mp.Agree {
		verdict = "the simulation misses the target: planned on the simulation instead"
	}
	fmt.Fprintf(stderr, "latency model (fitted on %s): mix %v, %.1f%% met on the model, %.1f%% simulated; %s\n",
		calib, mp.OnModel.Best.Mix, 100*mp.OnModel.Best.Met, 100*mp.Checked.Met, verdict)
	return mp.Final, out, nil
}

// RegisterWVA registers the Workload Variant Autoscaler's output metrics
// for a plan: wva_desired_replicas, wva_current_replicas (variants with a
// known current count), wva_desired_ratio (desired / current, when current
// > 0) with labels {variant_name, namespace, accelerator_type}, and
// wva_replica_scaling_total{variant_name, namespace, direction, reason}
// counting the change the plan asks for.
func RegisterWVA(reg prometheus.Registerer, namespace string, vs []PlannedVariant, current map[string]int) error {
	labels := []string{"variant_name", "namespace", "accelerator_type"}
	desired := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "wva_desired_replicas", Help: "Replicas the variant planner asks for, per variant."}, labels)
	cur := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "wva_current_replicas", Help: "Replicas the variant had when planned."}, labels)
	ratio := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "wva_desired_ratio", Help: "Desired over current replicas, per variant."}, labels)
	scaling := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "wva_replica_scaling_total", Help: "Scaling decisions of the variant planner, by direction."}, []string{"variant_name", "namespace", "direction", "reason"})
	for _, c := range []prometheus.Collector{desired, cur, ratio, scaling} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	for _, v := range vs {
		desired.WithLabelValues(v.Name, namespace, v.Accelerator).Set(float64(v.Desired))
		n, ok := current[v.Name]
		if !ok {
			continue
		}
		cur.WithLabelValues(v.Name, namespace, v.Accelerator).Set(float64(n))
		if n > 0 {
			ratio.WithLabelValues(v.Name, namespace, v.Accelerator).Set(float64(v.Desired) / float64(n))
		}
		switch {
		case v.Desired > n:
			scaling.WithLabelValues(v.Name, namespace, "up", "slo").Inc()
		case v.Desired < n:
			scaling.WithLabelValues(v.Name, namespace, "down", "cost").Inc()
		}
	}
	return nil
}

func writeMetrics(g prometheus.Gatherer, path string) error {
	mfs, err := g.Gather()
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	enc := expfmt.NewEncoder(f, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			f.Close()
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return f.Close()
}

func serveMetrics(ctx context.Context, g prometheus.Gatherer, addr string, stderr io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stderr, "serving the wva_* metrics on http://%s/metrics\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	case err := <-errc:
		return err
	}
}
