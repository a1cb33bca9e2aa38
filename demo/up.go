package demo

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/demo/report"
	"github.com/kvgate/kvgate/demo/workload"
	"github.com/kvgate/kvgate/internal/cliflag"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/progress"
	"github.com/kvgate/kvgate/internal/repo"
)

// Options are `kvgate up`'s flags.
type Options struct {
	Replicas    int
	Requests    int
	Policy      string
	Baseline    string
	NoCompare   bool
	KeepRunning bool
	Out         string
	// Bin is the kvgate binary whose subcommands run the components
	// (default: this executable).
	Bin          string
	Wasm         string
	TokenizerDir string
	Trace        string
	TimeScale    float64
	NumGPUBlocks int
	Workload     workload.Options
	// FailOpen starts the gateway with failure_mode_allow.
	FailOpen bool
	// GatewayArgs are extra `kvgate gateway` flags.
	GatewayArgs []string
	// Agent is the kvgate-agent binary run beside each fleet (default:
	// the one beside Bin, when there is one; "none": no agent).
	Agent string
	// MixedRun runs the online-beside-batch comparison (Mixed) instead of
	// the policy comparison.
	MixedRun bool
	Mixed    MixedOptions
	// PD runs a P/D fleet of this xPyD shape against a collocated fleet of
	// the same size instead of the policy comparison (--pd).
	PD                string
	PDDecider         string
	PDNonCachedTokens int
	// PDLoadFailurePolicy is the P/D sims' kv_load_failure_policy.
	PDLoadFailurePolicy string
	KVBytesPerToken     int
	// KVConnector is the --pd fleet's sidecars' --kv-connector ("": nixlv2).
	KVConnector string
	// EPD adds an encode server to the --pd fleet and sends every request
	// as a chat with an image (one of EPDImages).
	EPD       bool
	EPDImages int
}

// DefaultOptions size the default run at about a minute on two cores.
func DefaultOptions() Options {
	return Options{
		Replicas: 4, Requests: 200, Policy: PolicyPrecise, Baseline: PolicyRoundRobin,
		TimeScale: 0.03, NumGPUBlocks: 600, Workload: workload.DefaultOptions(), Mixed: DefaultMixedOptions(),
		PDDecider: DeciderAlways, PDNonCachedTokens: 256, KVBytesPerToken: 2048, EPDImages: 8,
	}
}

// ParseFlags parses `kvgate up` arguments and fills in the paths that
// depend on where the binary and the repository are.
func ParseFlags(args []string, stderr io.Writer) (Options, error) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("kvgate up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Replicas, "replicas", o.Replicas, "simulated vLLM servers")
	fs.IntVar(&o.Requests, "requests", o.Requests, "requests replayed per policy")
	fs.StringVar(&o.Policy, "policy", o.Policy, "routing policy: precise, load or round-robin")
	fs.StringVar(&o.Baseline, "baseline", o.Baseline, "policy the run is compared against")
	fs.BoolVar(&o.NoCompare, "no-compare", false, "run only --policy")
	fs.BoolVar(&o.KeepRunning, "keep-running", false, "leave the --policy fleet up after the run (Ctrl-C stops it)")
	fs.StringVar(&o.Out, "out", "", "output folder (default out/up-<time> at the repository root)")
	fs.StringVar(&o.Bin, "kvgate", "", "kvgate binary that runs the components (default: this one)")
	fs.StringVar(&o.Wasm, "wasm", "", "proxy-wasm filter (default: kvgate-filter.wasm beside the binary)")
	fs.StringVar(&o.TokenizerDir, "tokenizer", "", "Qwen3 tokenizer folder (default $KVGATE_TOKENIZER_DIR or .cache/tokenizers/qwen3)")
	fs.StringVar(&o.Trace, "trace", "", "Mooncake trace (default ../shared/traces/mooncake_synthetic_trace.jsonl beside the repository)")
	fs.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "simulator speed relative to an H100 (below 1: slower, so that the scaled-down prompts load the servers like full-size ones)")
	fs.IntVar(&o.NumGPUBlocks, "num-gpu-blocks", o.NumGPUBlocks, "KV-cache blocks per server")
	fs.DurationVar(&o.Workload.Duration, "duration", o.Workload.Duration, "span the trace's arrivals are compressed into")
	fs.IntVar(&o.Workload.WordsPerBlock, "words-per-block", o.Workload.WordsPerBlock, "words of prompt text per 512-token trace block (more: longer prompts)")
	fs.StringVar(&o.Agent, "agent", "", "kvgate-agent binary run as the fleet's node agent, for the report's network and GPU section (default: kvgate-agent beside the kvgate binary when present; none: no agent)")
	fs.BoolVar(&o.FailOpen, "failure-mode-allow", false, "gateway falls back to the servers directly when the picker fails")
	fs.Func("gateway-arg", "extra `kvgate gateway` flag (repeatable), e.g. --gateway-arg=--response-body-mode=none", func(v string) error {
		o.GatewayArgs = append(o.GatewayArgs, v)
		return nil
	})
	fs.BoolVar(&o.MixedRun, "mixed", false, "online traffic beside a sheddable batch job, with and without flow control, instead of the policy comparison")
	fs.IntVar(&o.Mixed.BatchRequests, "batch-requests", o.Mixed.BatchRequests, "with --mixed: requests of the batch job")
	fs.IntVar(&o.Mixed.BatchPromptWords, "batch-prompt-words", o.Mixed.BatchPromptWords, "with --mixed: words per batch prompt")
	fs.IntVar(&o.Mixed.BatchMaxTokens, "batch-max-tokens", o.Mixed.BatchMaxTokens, "with --mixed: output tokens per batch request")
	fs.IntVar(&o.Mixed.MaxConcurrency, "max-concurrency", o.Mixed.MaxConcurrency, "with --mixed: in-flight requests per server at which flow control holds dispatch (concurrency-detector)")
	fs.Float64Var(&o.Mixed.HoldbackMinCeiling, "holdback", o.Mixed.HoldbackMinCeiling, "with --mixed: fraction of --max-concurrency the batch job may fill (priority-holdback-policy minCeiling; 0: strict priority only)")
	fs.DurationVar(&o.Mixed.RequestTTL, "queue-ttl", o.Mixed.RequestTTL, "with --mixed: longest wait of a queued request (defaultRequestTTL)")
	fs.BoolVar(&o.Mixed.EnginePriority, "engine-priority", o.Mixed.EnginePriority, "with --mixed: one more fleet without flow control, its simulators at --scheduling-policy priority and the picker at --engine-priority")
	fs.StringVar(&o.PD, "pd", "", "run a P/D fleet of this shape (xPyD, e.g. 1P2D: sims with node agents, decode sidecars, disagg-profile-handler) against a collocated fleet of the same size")
	fs.StringVar(&o.PDDecider, "pd-decider", o.PDDecider, "with --pd: always (always-disagg-pd-decider), prefix (prefix-based-pd-decider) or transfer-cost (transfer-cost-pd-decider)")
	fs.IntVar(&o.PDNonCachedTokens, "pd-non-cached-tokens", o.PDNonCachedTokens, "with --pd-decider prefix: its nonCachedTokens")
	fs.StringVar(&o.PDLoadFailurePolicy, "kv-load-failure-policy", "fail", "with --pd: the sims' kv_load_failure_policy, fail (a failed or corrupt KV pull fails the request) or recompute")
	fs.BoolVar(&o.EPD, "epd", false, "with --pd: E/P/D, an encode server more and every request a chat with an image (one of --epd-images), against a collocated fleet of the same size")
	fs.IntVar(&o.EPDImages, "epd-images", o.EPDImages, "with --epd: distinct images the requests use")
	fs.IntVar(&o.KVBytesPerToken, "kv-bytes-per-token", o.KVBytesPerToken, "with --pd: KV bytes per token the agents move (0: the model's real size)")
	fs.StringVar(&o.KVConnector, "kv-connector", "", "with --pd: the sidecars' --kv-connector and the sims' KV connector: nixlv2 (NIXL READ through node agents, the default), offloading (the prefill sim's OffloadingConnector p2p tier; one prefill server) or shared-storage (a SharedStorageConnector folder)")
	if err := cliflag.Parse(fs, args); err != nil {
		return o, err
	}
	if o.EPD && (o.PD == "" || o.EPDImages < 1) {
		return o, errors.New("--epd needs --pd (the P/D shape) and --epd-images of at least 1")
	}
	if o.KVConnector != "" && o.PD == "" {
		return o, errors.New("--kv-connector needs --pd (the P/D fleet whose KV it moves)")
	}
	if o.PD != "" {
		shape, err := ParsePDShape(o.PD)
		if err != nil {
			return o, err
		}
		if err := checkKVConnector(o.KVConnector, shape); err != nil {
			return o, err
		}
		if _, err := pdConfig(o.PDDecider, o.PDNonCachedTokens, o.KVBytesPerToken, o.TimeScale, false); err != nil {
			return o, err
		}
	}
	switch {
	case o.Replicas < 1 || o.Replicas > 32:
		return o, fmt.Errorf("--replicas %d: want 1..32", o.Replicas)
	case o.Requests < 1:
		return o, fmt.Errorf("--requests %d: want at least 1", o.Requests)
	case o.Workload.WordsPerBlock < 1:
		return o, fmt.Errorf("--words-per-block %d: want at least 1", o.Workload.WordsPerBlock)
	case !(o.TimeScale > 0):
		return o, fmt.Errorf("--time-scale %v must be positive", o.TimeScale)
	case o.MixedRun && (o.Mixed.BatchRequests < 1 || o.Mixed.BatchPromptWords < 1 || o.Mixed.BatchMaxTokens < 1):
		return o, fmt.Errorf("--batch-requests, --batch-prompt-words and --batch-max-tokens must be positive")
	case o.MixedRun && o.Mixed.MaxConcurrency < 1:
		return o, fmt.Errorf("--max-concurrency %d: want at least 1", o.Mixed.MaxConcurrency)
	case o.MixedRun && (o.Mixed.HoldbackMinCeiling < 0 || o.Mixed.HoldbackMinCeiling >= 1):
		return o, fmt.Errorf("--holdback %v: want [0, 1)", o.Mixed.HoldbackMinCeiling)
	case o.MixedRun && o.Mixed.RequestTTL <= 0:
		return o, fmt.Errorf("--queue-ttl %v must be positive", o.Mixed.RequestTTL)
	case !o.MixedRun && o.Mixed.EnginePriority:
		return o, fmt.Errorf("--engine-priority applies to --mixed only")
	case o.MixedRun && o.KeepRunning:
		return o, fmt.Errorf("--keep-running does not apply to --mixed (three fleets run one after another)")
	}
	for _, p := range []string{o.Policy, o.Baseline} {
		if _, ok := Policies[p]; !ok {
			return o, fmt.Errorf("unknown policy %q", p)
		}
	}
	return o, o.resolvePaths()
}

// resolvePaths fills the defaults that depend on the file system.
func (o *Options) resolvePaths() error {
	if o.Bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("locate kvgate: %w", err)
		}
		o.Bin = exe
	}
	if o.Wasm == "" {
		o.Wasm = filepath.Join(filepath.Dir(o.Bin), "kvgate-filter.wasm")
	}
	switch o.Agent {
	case "":
		if p := filepath.Join(filepath.Dir(o.Bin), "kvgate-agent"); fileExists(p) {
			o.Agent = p
		}
	case "none":
		o.Agent = ""
	default:
		if !fileExists(o.Agent) {
			return fmt.Errorf("--agent %s: no such file", o.Agent)
		}
	}
	root := repoRoot()
	if o.TokenizerDir == "" {
		o.TokenizerDir = os.Getenv("KVGATE_TOKENIZER_DIR")
	}
	if o.TokenizerDir == "" {
		o.TokenizerDir = filepath.Join(root, ".cache", "tokenizers", "qwen3")
	}
	if o.Trace == "" {
		o.Trace = filepath.Join(root, "..", "shared", "traces", "mooncake_synthetic_trace.jsonl")
	}
	if o.Out == "" {
		o.Out = filepath.Join(root, "out", "up-"+time.Now().Format("20060102-150405"))
	}
	for what, p := range map[string]string{"--wasm (run make build)": o.Wasm, "--tokenizer (run make setup)": o.TokenizerDir, "--trace": o.Trace} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// repoRoot is the nearest folder above the working directory holding
// go.mod, or the working directory itself.
func repoRoot() string {
	if root, err := repo.Root(); err == nil {
		return root
	}
	if wd, err := os.Getwd(); err == nil {
		return wd
	}
	return "."
}

// Main is `kvgate up`: the run's report goes to stdout, flag errors to
// stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := ParseFlags(args, stderr)
	if err != nil {
		return err
	}
	return Run(ctx, o, stdout, progress.IsTerminal(stdout))
}

// Run executes a demo: one fresh fleet per policy, the same workload
// through each, then the comparison. tty enables the progress bar.
func Run(ctx context.Context, o Options, stdout io.Writer, tty bool) error {
	f, err := os.Open(o.Trace)
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	entries, err := workload.ReadTrace(f, 0)
	f.Close()
	if err != nil {
		return fmt.Errorf("trace %s: %w", o.Trace, err)
	}
	reqs := workload.Build(workload.Select(entries, o.Requests), o.Workload)
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	if o.PD != "" {
		return runPD(ctx, o, reqs, stdout, tty)
	}
	if o.MixedRun {
		return runMixed(ctx, o, reqs, stdout, tty)
	}
	policies := []string{o.Policy}
	if !o.NoCompare && o.Baseline != o.Policy {
		// The baseline goes first so that --keep-running leaves the
		// chosen policy's fleet up.
		policies = []string{o.Baseline, o.Policy}
	}
	blocks := 0
	for _, r := range reqs {
		blocks += r.Blocks
	}
	fmt.Fprintf(stdout, "kvgate up: %d simulated %s servers, %d requests from %s (%d trace blocks), policies: %s\n",
		o.Replicas, Model, len(reqs), filepath.Base(o.Trace), blocks, strings.Join(policies, ", "))
	fmt.Fprintf(stdout, "output: %s\n", o.Out)

	var runs []report.Run
	var tel []report.Telemetry
	for i, pol := range policies {
		last := i == len(policies)-1
		r, stack, err := runPolicy(ctx, o, pol, reqs, stdout, tty)
		if err != nil {
			return err
		}
		runs = append(runs, r)
		if stack.AgentAddr != "" {
			tel = append(tel, agentTelemetry(ctx, pol, stack.AgentAddr))
		}
		if last && o.KeepRunning {
			defer stack.Close()
			defer func() { keepRunning(ctx, stack, stdout) }()
			break
		}
		stack.Close()
	}
	sums := make([]report.Summary, len(runs))
	for i, r := range runs {
		sums[i] = report.Summarize(r)
	}
	fmt.Fprintln(stdout)
	if err := report.WriteTable(stdout, sums); err != nil {
		return err
	}
	if err := writeOutputs(o, runs, sums, tel); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nreport:  %s\nresults: %s\nlogs:    %s\n", filepath.Join(o.Out, "report.html"),
		filepath.Join(o.Out, "results.json"), filepath.Join(o.Out, "logs"))
	for _, s := range sums {
		if s.Errors > 0 {
			return fmt.Errorf("%s: %d of %d requests failed (see results.json)", s.Policy, s.Errors, s.Requests)
		}
	}
	return nil
}

// runPolicy starts a fleet for pol, replays reqs through it and returns the
// run with the fleet still up.
func runPolicy(ctx context.Context, o Options, pol string, reqs []workload.Request, stdout io.Writer, tty bool) (report.Run, *Stack, error) {
	fmt.Fprintf(stdout, "\n[%s] starting %d sims, epp and gateway...\n", pol, o.Replicas)
	start := time.Now()
	stack, err := StartStack(ctx, StackConfig{
		Bin: o.Bin, Wasm: o.Wasm, TokenizerDir: o.TokenizerDir, Replicas: o.Replicas, Policy: pol,
		LogDir: filepath.Join(o.Out, "logs", pol), TimeScale: o.TimeScale, NumGPUBlocks: o.NumGPUBlocks,
		HashSeed: kvhash.DefaultSeed, FailOpen: o.FailOpen, GatewayArgs: o.GatewayArgs, AgentBin: o.Agent, Ready: 60 * time.Second,
		Progress: func(s string) { fmt.Fprintf(stdout, "[%s]   %s\n", pol, s) },
	})
	if err != nil {
		return report.Run{}, nil, fmt.Errorf("%s fleet: %w", pol, err)
	}
	fmt.Fprintf(stdout, "[%s] fleet ready in %.1fs; replaying %d requests through %s\n", pol, time.Since(start).Seconds(), len(reqs), stack.GatewayURL)
	run, err := replay(ctx, stack, pol, reqs, 0, stdout, tty)
	if err != nil {
		return report.Run{}, nil, err
	}
	return run, stack, nil
}

// untilExit is ctx, also cancelled, with the component's exit as the cause,
// when a component of stack dies: its last lines are then the error. On a
// terminal's Ctrl-C the children get the signal too; their exit is then no
// failure. The caller calls cancel when done.
func untilExit(ctx context.Context, stack *Stack) (context.Context, context.CancelCauseFunc) {
	rctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case p := <-stack.Exited():
			if ctx.Err() == nil {
				cancel(p.AsError())
			}
		case <-rctx.Done():
		}
	}()
	return rctx, cancel
}

// replay sends reqs through a running fleet's gateway and measures the
// run (as chats each led by one of images images when images > 0); a
// component that dies ends it (and closes the fleet).
func replay(ctx context.Context, stack *Stack, pol string, reqs []workload.Request, images int, stdout io.Writer, tty bool) (report.Run, error) {
	rctx, cancel := untilExit(ctx, stack)
	defer cancel(nil)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	before := readCounters(rctx, client, stack.Sims)
	pl := newPoller(stack.Sims, 250*time.Millisecond)
	pctx, stopPoll := context.WithCancel(rctx)
	var wg sync.WaitGroup
	wg.Add(1)
	t0 := time.Now()
	go func() {
		defer wg.Done()
		pl.run(pctx, t0)
	}()
	bar := newProgress(stdout, tty, pol, len(reqs))
	target := workload.Target{URL: stack.GatewayURL + "/v1/completions", Model: Model, Client: client, Images: images}
	if images > 0 {
		target.URL = stack.GatewayURL + "/v1/chat/completions"
	}
	results := workload.Replay(rctx, target, reqs, bar.update)
	wall := time.Since(t0)
	stopPoll()
	wg.Wait()
	bar.finish(wall)
	if err := context.Cause(rctx); err != nil {
		stack.Close()
		if ctx.Err() != nil {
			return report.Run{}, ctx.Err()
		}
		return report.Run{}, fmt.Errorf("%s run: %w", pol, err)
	}
	after := readCounters(ctx, client, stack.Sims)
	run := report.Run{Policy: pol, Wall: wall, Results: results}
	for i, s := range stack.Sims {
		run.Endpoints = append(run.Endpoints, report.Endpoint{
			Name: s.Name, Requests: after[i].requests - before[i].requests,
			PromptTokens: after[i].promptTokens - before[i].promptTokens,
			CacheHits:    after[i].hits - before[i].hits, CacheQueries: after[i].queries - before[i].queries,
			Samples: pl.samples(i),
		})
	}
	return run, nil
}

func writeOutputs(o Options, runs []report.Run, sums []report.Summary, tel []report.Telemetry) error {
	if err := writeJSON(filepath.Join(o.Out, "results.json"), map[string]any{"options": o, "summaries": sums, "runs": runs, "telemetry": tel}); err != nil {
		return err
	}
	setup := []string{
		fmt.Sprintf("%d simulated vLLM servers (%s, preset qwen3-0.6b-h100, time scale %g, %d KV blocks of %d tokens each)", o.Replicas, Model, o.TimeScale, o.NumGPUBlocks, kvhash.DefaultBlockSize),
		fmt.Sprintf("%d requests from the Mooncake trace: the most-shared prefix groups, each 512-token block as %d words of text (prompts capped at %d blocks), output capped at %d tokens, arrivals compressed into %s",
			o.Requests, o.Workload.WordsPerBlock, o.Workload.MaxBlocks, o.Workload.MaxOutputTokens, o.Workload.Duration),
		"each policy ran on a fresh fleet (empty caches), through kvgate gateway with the wasm filter and the kvgate Endpoint Picker",
	}
	for _, r := range runs {
		setup = append(setup, fmt.Sprintf("%s: %s", r.Policy, Policies[r.Policy]))
	}
	page := report.Page{Title: "kvgate up: routing policies compared", Generated: time.Now(), Setup: setup, Runs: runs, Summaries: sums, Telemetry: tel}
	if o.Agent == "" {
		page.NoAgent = "no kvgate-agent beside the kvgate binary (make build), or --agent none"
	}
	return writeHTML(filepath.Join(o.Out, "report.html"), page)
}

// writeJSON writes v, indented, to path.
func writeJSON(path string, v any) error {
	js, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, js, 0o644); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return nil
}

// writeHTML renders p to path.
func writeHTML(path string, p report.Page) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	err = report.WriteHTML(f, p)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return nil
}

// keepRunning prints how to use the fleet and waits for Ctrl-C or a
// component's death.
func keepRunning(ctx context.Context, s *Stack, stdout io.Writer) {
	fmt.Fprintf(stdout, "\nThe fleet is up. Gateway: %s\nTry:\n  curl -sN %s/v1/completions -H 'Content-Type: application/json' \\\n    -d '{\"model\":%q,\"prompt\":\"The capital of France is\",\"max_tokens\":16,\"stream\":true}'\nPress Ctrl-C to stop.\n",
		s.GatewayURL, s.GatewayURL, Model)
	select {
	case <-ctx.Done():
	case p := <-s.Exited():
		if ctx.Err() == nil {
			fmt.Fprintln(stdout, p.AsError())
		}
	}
	fmt.Fprintln(stdout, "stopping...")
}

// replayProgress reports a replay: a redrawn bar on a terminal, a line per
// quarter otherwise. update may be called from many goroutines.
type replayProgress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	label string
	total int
	shown int
	start time.Time
}

func newProgress(w io.Writer, tty bool, label string, total int) *replayProgress {
	return &replayProgress{w: w, tty: tty, label: label, total: total, start: time.Now()}
}

func (p *replayProgress) update(done int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if done <= p.shown {
		return
	}
	p.shown = done
	if p.tty {
		fmt.Fprintf(p.w, "\r[%s] %s %d/%d %.0fs ", p.label, progress.Bar(done, p.total), done, p.total, time.Since(p.start).Seconds())
		return
	}
	if q := 4 * done / p.total; q > 4*(done-1)/p.total {
		fmt.Fprintf(p.w, "[%s]   %d/%d requests done (%.0fs)\n", p.label, done, p.total, time.Since(p.start).Seconds())
	}
}

func (p *replayProgress) finish(wall time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintln(p.w)
	}
	fmt.Fprintf(p.w, "[%s] replay finished in %.1fs\n", p.label, wall.Seconds())
}
