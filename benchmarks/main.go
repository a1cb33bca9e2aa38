package benchmarks

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/progress"
	"github.com/kvgate/kvgate/sim/engine"
)

// ErrUsage reports bad command-line arguments; the usage text has already
// been written.
var ErrUsage = errors.New("usage")

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// Options are `kvgate bench`'s flags, one field per flag.
type Options struct {
	Trace          string
	Workload       string
	Replicas       int
	Preset         string
	Policies       string
	QPSScale       float64
	Sweep          string
	Seed           uint64
	Out            string
	Limit          int
	ScrapeInterval time.Duration
	KVEventDelay   time.Duration
	// Shared-prefix workload.
	Groups, PrefixTokens, SuffixTokens, OutputTokens int
	// Generated workloads' load stages. The chat workload keeps its own
	// unless RampSet (--ramp or --stage-duration was given).
	Ramp          string
	StageDuration time.Duration
	RampSet       bool
	Configs       []string
	Verbose       bool
	// Presets is a mixed fleet (name:count,...) instead of Preset.
	Presets string
	// Burst groups generated arrivals; ArrivalQuantum floors arrivals.
	Burst          int
	ArrivalQuantum time.Duration
	// SLO is carried by a Fraction of the requests.
	SLOTTFT, SLOTPOT time.Duration
	SLOFraction      float64
	// Mixed workload: the batch stream beside the chat traffic, and the
	// clients' patience (0: unbounded).
	BatchQPS                    float64
	BatchPromptTokens           int
	BatchOutputTokens           int
	OnlineTimeout, BatchTimeout time.Duration
	// EngineScheduling is the engines' vLLM --scheduling-policy.
	EngineScheduling string
	// Autoscale compares scaling policies instead of routing policies.
	Autoscale AutoscaleOptions
	// Job is the async batch job beside the workload (asyncjob.go).
	Job JobOptions
	// set records which flags were given, for the checks that depend on it.
	set map[string]bool
}

// DefaultOptions are the flag defaults.
func DefaultOptions() Options {
	return Options{
		Replicas: 8, Preset: "llama-3.1-8b-h100", Policies: DefaultPolicies(), QPSScale: 1, Seed: 1,
		ScrapeInterval: cluster.DefaultScrapeInterval, KVEventDelay: cluster.DefaultKVEventDelay,
		Groups: 150, PrefixTokens: 6000, SuffixTokens: 1200, OutputTokens: 1000,
		Ramp: "3,10,20,30,40,50,60", StageDuration: 30 * time.Second,
		Burst: 1, SLOFraction: 1,
		BatchPromptTokens: 1000, BatchOutputTokens: 300,
		Job:              defaultJobOptions(),
		EngineScheduling: string(engine.SchedulingFCFS),
	}
}

// plan is what the options resolve to before anything runs.
type plan struct {
	preset engine.Preset
	mixed  []engine.Preset
	scales []float64
	pols   []cluster.Policy
}

// Main is `kvgate bench` (and `kvgate bench pd`, PDMain). args exclude the
// subcommand name. Progress, the
// results table and errors go to stderr (stdout stays free for scripts);
// the results themselves go to --out.
func Main(ctx context.Context, args []string, _, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "pd" {
		return PDMain(ctx, args[1:], stderr)
	}
	o, pl, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	return run(ctx, o, pl, stderr)
}

// parseFlags parses and checks the flags; errors wrap ErrUsage and the
// usage text has been written.
func parseFlags(args []string, stderr io.Writer) (Options, plan, error) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("kvgate bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Trace, "trace", o.Trace, "Mooncake trace (JSON lines: timestamp ms, input_length, output_length, hash_ids of 512-token blocks)")
	fs.StringVar(&o.Workload, "workload", o.Workload, "generated workload instead of --trace: shared-prefix | chat | mixed (chat as objective \"online\", priority 100, plus a batch stream as \"batch\", priority -1)")
	fs.IntVar(&o.Replicas, "replicas", o.Replicas, "simulated model servers")
	fs.StringVar(&o.Preset, "preset", o.Preset, "engine preset: "+presetNames())
	fs.StringVar(&o.Policies, "policies", o.Policies, "comma-separated built-in policies")
	fs.Float64Var(&o.QPSScale, "qps-scale", o.QPSScale, "multiply the arrival rate (divide arrival times) by this factor")
	fs.StringVar(&o.Sweep, "sweep", o.Sweep, "comma-separated --qps-scale values to run each policy at (a QPS sweep)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the generators, the picker's randomness and scrape phases")
	fs.StringVar(&o.Out, "out", o.Out, "directory for results.json, results.md and plots (required)")
	fs.IntVar(&o.Limit, "limit", o.Limit, "use only the first N requests (0: all)")
	fs.DurationVar(&o.ScrapeInterval, "scrape-interval", o.ScrapeInterval, "metrics scrape interval (staleness of load metrics)")
	fs.DurationVar(&o.KVEventDelay, "kv-event-delay", o.KVEventDelay, "delay from an engine step's end to its KV events reaching the index")
	fs.IntVar(&o.Groups, "groups", o.Groups, "shared-prefix: groups")
	fs.IntVar(&o.PrefixTokens, "prefix-tokens", o.PrefixTokens, "shared-prefix: tokens of each group's prefix")
	fs.IntVar(&o.SuffixTokens, "suffix-tokens", o.SuffixTokens, "shared-prefix: unique tokens per request")
	fs.IntVar(&o.OutputTokens, "output-tokens", o.OutputTokens, "shared-prefix: output tokens per request")
	fs.StringVar(&o.Ramp, "ramp", o.Ramp, "generated workloads: QPS of each load stage (chat: conversations/s, default 1,2,4 for 60 s each)")
	fs.DurationVar(&o.StageDuration, "stage-duration", o.StageDuration, "generated workloads: duration of each load stage")
	fs.Var((*stringList)(&o.Configs), "config", "EndpointPickerConfig file to run as an extra policy named after the file (repeatable)")
	fs.BoolVar(&o.Verbose, "v", o.Verbose, "log picker warnings")
	fs.StringVar(&o.Presets, "presets", o.Presets, "mixed fleet instead of --preset: name:count,... (one model; --replicas defaults to the sum)")
	fs.IntVar(&o.Burst, "burst", o.Burst, "generated workloads: requests (chat: conversations) arriving together, burst instants Poisson at QPS/N")
	fs.DurationVar(&o.ArrivalQuantum, "arrival-quantum", o.ArrivalQuantum, "floor every arrival to a multiple of this (e.g. 1s): a quantum's requests arrive at once")
	fs.DurationVar(&o.SLOTTFT, "slo-ttft", o.SLOTTFT, "TTFT objective (e.g. 500ms): requests carry it to the picker in x-llm-d-slo-ttft-ms; adds attainment columns")
	fs.DurationVar(&o.SLOTPOT, "slo-tpot", o.SLOTPOT, "TPOT objective (e.g. 50ms), in x-llm-d-slo-tpot-ms")
	fs.Float64Var(&o.SLOFraction, "slo-fraction", o.SLOFraction, "share of requests, chosen by --seed, that carry the SLO; attainment is over them")
	fs.Float64Var(&o.BatchQPS, "batch-qps", o.BatchQPS, "mixed: batch requests/s (0: online traffic alone)")
	fs.IntVar(&o.BatchPromptTokens, "batch-prompt-tokens", o.BatchPromptTokens, "mixed: unique prompt tokens per batch request")
	fs.IntVar(&o.BatchOutputTokens, "batch-output-tokens", o.BatchOutputTokens, "mixed: output tokens per batch request")
	fs.DurationVar(&o.OnlineTimeout, "online-timeout", o.OnlineTimeout, "mixed: an online client cancels a request not started after this (0: never)")
	fs.DurationVar(&o.BatchTimeout, "batch-timeout", o.BatchTimeout, "mixed: a batch client cancels a request not started after this (0: never)")
	fs.StringVar(&o.EngineScheduling, "engine-scheduling-policy", o.EngineScheduling, "the simulated vLLM servers' --scheduling-policy: fcfs | priority (each request carries its objective's priority to the engine)")
	o.Autoscale.flags(fs)
	o.Job.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, plan{}, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	o.RampSet = o.set["ramp"] || o.set["stage-duration"]
	pl, err := o.plan()
	if err == nil {
		err = o.Autoscale.check(o, pl)
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		fs.Usage()
		return o, plan{}, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return o, pl, nil
}

// plan checks the options and resolves the preset, the QPS scales and the
// policies.
func (o Options) plan() (plan, error) {
	var pl plan
	if o.Out == "" {
		return pl, errors.New("--out is required")
	}
	if (o.Trace == "") == (o.Workload == "") {
		return pl, errors.New("give exactly one of --trace and --workload")
	}
	var ok bool
	if pl.preset, ok = engine.LookupPreset(o.Preset); !ok {
		return pl, fmt.Errorf("unknown preset %q (%s)", o.Preset, presetNames())
	}
	if o.Presets != "" {
		if o.set["preset"] {
			return pl, errors.New("give one of --preset and --presets")
		}
		var err error
		if pl.mixed, err = parsePresets(o.Presets); err != nil {
			return pl, err
		}
		if o.set["replicas"] && o.Replicas != len(pl.mixed) {
			return pl, fmt.Errorf("--replicas %d, but --presets counts %d", o.Replicas, len(pl.mixed))
		}
	}
	if o.Burst < 1 || (o.Trace != "" && o.set["burst"]) {
		return pl, errors.New("--burst needs a generated workload and N ≥ 1")
	}
	if p := engine.SchedulingPolicy(o.EngineScheduling); p != engine.SchedulingFCFS && p != engine.SchedulingPriority {
		return pl, fmt.Errorf("--engine-scheduling-policy %q: want %s or %s", o.EngineScheduling, engine.SchedulingFCFS, engine.SchedulingPriority)
	}
	if o.ArrivalQuantum < 0 {
		return pl, errors.New("--arrival-quantum must not be negative")
	}
	slo := o.slo()
	if o.set["slo-fraction"] && !slo.Active() {
		return pl, errors.New("--slo-fraction needs --slo-ttft or --slo-tpot")
	}
	if !(o.SLOFraction > 0 && o.SLOFraction <= 1) {
		return pl, fmt.Errorf("--slo-fraction must be in (0, 1], got %v", o.SLOFraction)
	}
	if err := o.clusterOptions(pl, nil).Validate(); err != nil {
		return pl, err
	}
	if _, err := o.job(); err != nil {
		return pl, err
	}
	pl.scales = []float64{o.QPSScale}
	if o.Sweep != "" {
		var err error
		if pl.scales, err = floats(o.Sweep); err != nil {
			return pl, fmt.Errorf("--sweep: %v", err)
		}
	}
	for _, x := range pl.scales {
		if x <= 0 {
			return pl, fmt.Errorf("QPS scales must be positive, got %v", x)
		}
	}
	var err error
	if pl.pols, err = selectPolicies(o.Policies, o.Configs); err != nil {
		return pl, err
	}
	if o.Workload != "" {
		if _, err := floats(o.Ramp); err != nil {
			return pl, fmt.Errorf("--ramp: %v", err)
		}
		switch o.Workload {
		case "shared-prefix", "chat", "mixed":
		default:
			return pl, fmt.Errorf("unknown workload %q (shared-prefix | chat | mixed)", o.Workload)
		}
	}
	return pl, nil
}

// run loads the workload, runs every policy at every QPS scale and writes
// the results.
func run(ctx context.Context, o Options, pl plan, stderr io.Writer) error {
	if o.Autoscale.Policies != "" {
		return runAutoscale(ctx, o, pl, stderr)
	}
	reqs, name, err := o.load()
	if err != nil {
		return err
	}
	if st := workload.Summarize(reqs); st.Requests > 0 {
		fmt.Fprintf(stderr, "%s: %d requests, %.0f prompt tokens/request, %.0f output tokens/request, %v of arrivals\n",
			name, st.Requests, float64(st.PromptTokens)/float64(st.Requests), float64(st.OutputTokens)/float64(st.Requests), st.Duration.Round(time.Second))
	}
	results := &Results{Workload: name, Replicas: o.replicas(pl), Preset: pl.preset.Name, Seed: o.Seed}
	if pl.mixed != nil {
		results.Preset = o.Presets
	}
	for _, x := range pl.scales {
		// Quantized after scaling, so that a burst spans the quantum of
		// simulated time at every scale.
		scaled := workload.QuantizeArrivals(workload.ScaleQPS(reqs, x), o.ArrivalQuantum)
		for _, p := range pl.pols {
			s, err := o.runPolicy(ctx, pl, p, x, scaled, stderr)
			if err != nil {
				return err
			}
			if s != nil {
				results.Policies = append(results.Policies, *s)
			}
		}
	}
	if len(results.Policies) == 0 {
		return errors.New("no policy could run")
	}
	if err := writeResults(o.Out, results); err != nil {
		return err
	}
	fmt.Fprint(stderr, "\n", Markdown(results))
	return nil
}

// load reads the trace or generates the workload, cut to --limit, and
// names it for the report.
func (o Options) load() (reqs []workload.Request, name string, err error) {
	if o.Trace != "" {
		f, err := os.Open(o.Trace)
		if err != nil {
			return nil, "", fmt.Errorf("trace: %w", err)
		}
		reqs, err = workload.LoadMooncake(f)
		f.Close()
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", o.Trace, err)
		}
		name = "trace " + filepath.Base(o.Trace)
	} else {
		qps, _ := floats(o.Ramp) // checked by plan
		stages := workload.RampStages(qps, o.StageDuration)
		switch o.Workload {
		case "shared-prefix":
			sp := workload.SharedPrefix{Groups: o.Groups, PrefixTokens: o.PrefixTokens, SuffixTokens: o.SuffixTokens, OutputTokens: o.OutputTokens, Stages: stages, Burst: o.Burst}
			reqs, err = sp.Generate(o.Seed)
			name = fmt.Sprintf("shared-prefix %d groups × %d-token prefix + %d, %d out, ramp %s QPS × %v", o.Groups, o.PrefixTokens, o.SuffixTokens, o.OutputTokens, o.Ramp, o.StageDuration)
		case "chat":
			c := workload.DefaultChat()
			if o.RampSet {
				c.Stages = stages
			}
			c.Burst = o.Burst
			reqs, err = c.Generate(o.Seed)
			name = fmt.Sprintf("chat %d turns, conversations starting at %s", c.Turns, describe(c.Stages))
		case "mixed":
			c := workload.DefaultChat()
			if o.RampSet {
				c.Stages = stages
			}
			c.Burst = o.Burst
			m := workload.Mixed{Online: c, OnlineTimeout: o.OnlineTimeout,
				Batch: workload.Batch{QPS: o.BatchQPS, PromptTokens: o.BatchPromptTokens, OutputTokens: o.BatchOutputTokens, Timeout: o.BatchTimeout}}
			reqs, err = m.Generate(o.Seed)
			name = fmt.Sprintf("mixed: online chat %d turns, conversations starting at %s; batch %g req/s × %d prompt + %d output tokens",
				c.Turns, describe(c.Stages), o.BatchQPS, o.BatchPromptTokens, o.BatchOutputTokens)
		}
		if err != nil {
			return nil, "", err
		}
		if o.Burst > 1 {
			name += fmt.Sprintf(", bursts of %d", o.Burst)
		}
	}
	if o.ArrivalQuantum > 0 {
		name += fmt.Sprintf(", arrivals floored to %v", o.ArrivalQuantum)
	}
	if o.Limit > 0 && o.Limit < len(reqs) {
		reqs = reqs[:o.Limit]
	}
	if len(reqs) == 0 && o.Job.Requests == 0 {
		return nil, "", errors.New("the workload has no requests")
	}
	return reqs, name, nil
}

// runPolicy runs one policy at one QPS scale; a nil summary means the
// policy was skipped (a plugin this build lacks).
func (o Options) runPolicy(ctx context.Context, pl plan, p cluster.Policy, x float64, reqs []workload.Request, stderr io.Writer) (*Summary, error) {
	logger := slog.New(slog.DiscardHandler)
	if o.Verbose {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	co := o.clusterOptions(pl, logger)
	var err error
	if co.Job, err = o.job(); err != nil {
		return nil, err
	}
	label := fmt.Sprintf("%s ×%g", p.Name, x)
	tty := progress.IsTerminal(stderr)
	if tty {
		co.Progress = progressBar(stderr, label)
	}
	wall := time.Now()
	res, err := cluster.Run(ctx, co, p, reqs)
	if err != nil {
		var unknown *scheduling.UnknownTypeError
		if errors.As(err, &unknown) {
			fmt.Fprintf(stderr, "skipping policy %s: this build has no plugin %q\n", p.Name, unknown.Type)
			return nil, nil
		}
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	s := Summarize(p.Name, x, res)
	s.wall = time.Since(wall)
	if tty {
		fmt.Fprintln(stderr)
	}
	fmt.Fprintf(stderr, "%-16s p90 TTFT %8.3fs  hit %.3f  %6.0f out tok/s  wall %.1fs (%.0f simulated req/s)\n",
		label, s.TTFTP90, s.PrefixHitRatio, s.ThroughputOutputTokS, s.wall.Seconds(), float64(len(reqs))/s.wall.Seconds())
	return &s, nil
}

// slo is the objective the requests carry.
func (o Options) slo() cluster.SLO {
	return cluster.SLO{TTFT: o.SLOTTFT, TPOT: o.SLOTPOT, Fraction: o.SLOFraction}
}

// replicas is the fleet size: a mixed fleet's count, else --replicas.
func (o Options) replicas(pl plan) int {
	if pl.mixed != nil {
		return len(pl.mixed)
	}
	return o.Replicas
}

// clusterOptions are the simulation's options for pl.
func (o Options) clusterOptions(pl plan, logger *slog.Logger) cluster.Options {
	return cluster.Options{
		Replicas: o.replicas(pl), Preset: pl.preset, Presets: pl.mixed, ScrapeInterval: o.ScrapeInterval, KVEventDelay: o.KVEventDelay,
		Seed: o.Seed, Logger: logger, SLO: o.slo(), Objectives: o.objectives(),
		SchedulingPolicy: engine.SchedulingPolicy(o.EngineScheduling),
	}
}

// Priorities of the mixed workload's InferenceObjectives.
const (
	OnlinePriority = 100
	BatchPriority  = -1
)

// objectives are the InferenceObjectives the workload's requests name.
func (o Options) objectives() map[string]int {
	if o.Workload != "mixed" && o.Job.Requests == 0 {
		return nil
	}
	return map[string]int{workload.ObjectiveOnline: OnlinePriority, workload.ObjectiveBatch: BatchPriority}
}

func presetNames() string {
	var n []string
	for _, p := range engine.Presets() {
		n = append(n, p.Name)
	}
	return strings.Join(n, " | ")
}

func floats(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// progressBar redraws one line on a terminal as requests complete.
func progressBar(w io.Writer, label string) func(done, total int) {
	return func(done, total int) {
		fmt.Fprintf(w, "\r%-16s %s %d/%d", label, progress.Bar(done, total), done, total)
	}
}

func describe(stages []workload.Stage) string {
	parts := make([]string, len(stages))
	for i, st := range stages {
		parts[i] = fmt.Sprintf("%g/s for %v", st.QPS, st.Duration)
	}
	return strings.Join(parts, ", ")
}
