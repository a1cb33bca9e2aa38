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

// Main is `kvgate bench`. args exclude the subcommand name. Progress, the
// results table and errors go to stderr (stdout stays free for scripts);
// the results themselves go to --out.
func Main(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvgate bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		trace     = fs.String("trace", "", "Mooncake trace (JSON lines: timestamp ms, input_length, output_length, hash_ids of 512-token blocks)")
		wl        = fs.String("workload", "", "generated workload instead of --trace: shared-prefix | chat")
		replicas  = fs.Int("replicas", 8, "simulated model servers")
		presetN   = fs.String("preset", "llama-3.1-8b-h100", "engine preset: "+presetNames())
		policies  = fs.String("policies", DefaultPolicies(), "comma-separated built-in policies")
		qpsScale  = fs.Float64("qps-scale", 1, "multiply the arrival rate (divide arrival times) by this factor")
		sweep     = fs.String("sweep", "", "comma-separated --qps-scale values to run each policy at (a QPS sweep)")
		seed      = fs.Uint64("seed", 1, "seed of the generators, the picker's randomness and scrape phases")
		out       = fs.String("out", "", "directory for results.json, results.md and plots (required)")
		limit     = fs.Int("limit", 0, "use only the first N requests (0: all)")
		scrape    = fs.Duration("scrape-interval", cluster.DefaultScrapeInterval, "metrics scrape interval (staleness of load metrics)")
		kvDelay   = fs.Duration("kv-event-delay", cluster.DefaultKVEventDelay, "delay from an engine step's end to its KV events reaching the index")
		groups    = fs.Int("groups", 150, "shared-prefix: groups")
		prefix    = fs.Int("prefix-tokens", 6000, "shared-prefix: tokens of each group's prefix")
		suffix    = fs.Int("suffix-tokens", 1200, "shared-prefix: unique tokens per request")
		output    = fs.Int("output-tokens", 1000, "shared-prefix: output tokens per request")
		ramp      = fs.String("ramp", "3,10,20,30,40,50,60", "generated workloads: QPS of each load stage (chat: conversations/s, default 1,2,4 for 60 s each)")
		stageDur  = fs.Duration("stage-duration", 30*time.Second, "generated workloads: duration of each load stage")
		configs   stringList
		verbosity = fs.Bool("v", false, "log picker warnings")
	)
	fs.Var(&configs, "config", "EndpointPickerConfig file to run as an extra policy named after the file (repeatable)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	usage := func(format string, a ...any) error {
		fmt.Fprintf(stderr, format+"\n", a...)
		fs.Usage()
		return fmt.Errorf("%w: "+format, append([]any{ErrUsage}, a...)...)
	}
	if *out == "" {
		return usage("--out is required")
	}
	if (*trace == "") == (*wl == "") {
		return usage("give exactly one of --trace and --workload")
	}
	preset, ok := engine.LookupPreset(*presetN)
	if !ok {
		return usage("unknown preset %q (%s)", *presetN, presetNames())
	}
	scales := []float64{*qpsScale}
	if *sweep != "" {
		var err error
		if scales, err = floats(*sweep); err != nil {
			return usage("--sweep: %v", err)
		}
	}
	for _, x := range scales {
		if x <= 0 {
			return usage("QPS scales must be positive, got %v", x)
		}
	}
	pols, err := selectPolicies(*policies, configs)
	if err != nil {
		return usage("%v", err)
	}

	var reqs []workload.Request
	var name string
	switch {
	case *trace != "":
		f, err := os.Open(*trace)
		if err != nil {
			return fmt.Errorf("trace: %w", err)
		}
		reqs, err = workload.LoadMooncake(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", *trace, err)
		}
		name = "trace " + filepath.Base(*trace)
	default:
		qps, err := floats(*ramp)
		if err != nil {
			return usage("--ramp: %v", err)
		}
		stages := workload.RampStages(qps, *stageDur)
		switch *wl {
		case "shared-prefix":
			sp := workload.SharedPrefix{Groups: *groups, PrefixTokens: *prefix, SuffixTokens: *suffix, OutputTokens: *output, Stages: stages}
			reqs, err = sp.Generate(*seed)
			name = fmt.Sprintf("shared-prefix %d groups × %d-token prefix + %d, %d out, ramp %s QPS × %v", *groups, *prefix, *suffix, *output, *ramp, *stageDur)
		case "chat":
			c := workload.DefaultChat()
			if set["ramp"] || set["stage-duration"] {
				c.Stages = stages
			}
			reqs, err = c.Generate(*seed)
			name = fmt.Sprintf("chat %d turns, conversations starting at %s", c.Turns, describe(c.Stages))
		default:
			return usage("unknown workload %q (shared-prefix | chat)", *wl)
		}
		if err != nil {
			return err
		}
	}
	if *limit > 0 && *limit < len(reqs) {
		reqs = reqs[:*limit]
	}
	if len(reqs) == 0 {
		return errors.New("the workload has no requests")
	}

	logger := slog.New(slog.DiscardHandler)
	if *verbosity {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	opts := cluster.Options{
		Replicas: *replicas, Preset: preset, ScrapeInterval: *scrape, KVEventDelay: *kvDelay,
		Seed: *seed, Logger: logger,
	}
	st := workload.Summarize(reqs)
	fmt.Fprintf(stderr, "%s: %d requests, %.0f prompt tokens/request, %.0f output tokens/request, %v of arrivals\n",
		name, st.Requests, float64(st.PromptTokens)/float64(st.Requests), float64(st.OutputTokens)/float64(st.Requests), st.Duration.Round(time.Second))
	results := &Results{Workload: name, Replicas: *replicas, Preset: preset.Name, Seed: *seed}
	tty := progress.IsTerminal(stderr)
	for _, x := range scales {
		scaled := workload.ScaleQPS(reqs, x)
		for _, p := range pols {
			o := opts
			label := fmt.Sprintf("%s ×%g", p.Name, x)
			if tty {
				o.Progress = progressBar(stderr, label)
			}
			wall := time.Now()
			res, err := cluster.Run(ctx, o, p, scaled)
			if err != nil {
				var unknown *scheduling.UnknownTypeError
				if errors.As(err, &unknown) {
					fmt.Fprintf(stderr, "skipping policy %s: this build has no plugin %q\n", p.Name, unknown.Type)
					continue
				}
				return fmt.Errorf("%s: %w", label, err)
			}
			s := Summarize(p.Name, x, res)
			s.wall = time.Since(wall)
			if tty {
				fmt.Fprintln(stderr)
			}
			fmt.Fprintf(stderr, "%-16s p90 TTFT %8.3fs  hit %.3f  %6.0f out tok/s  wall %.1fs (%.0f simulated req/s)\n",
				label, s.TTFTP90, s.PrefixHitRatio, s.ThroughputOutputTokS, s.wall.Seconds(), float64(len(scaled))/s.wall.Seconds())
			results.Policies = append(results.Policies, s)
		}
	}
	if len(results.Policies) == 0 {
		return errors.New("no policy could run")
	}
	if err := writeResults(*out, results); err != nil {
		return err
	}
	fmt.Fprint(stderr, "\n", Markdown(results))
	return nil
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
