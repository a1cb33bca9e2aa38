package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/demo/report"
	"github.com/kvgate/kvgate/demo/workload"
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/kvhash"
)

// MixedOptions shape `kvgate up --mixed`: the trace's requests are the
// online traffic, and an offline job of sheddable requests, sized to
// saturate the fleet on its own, arrives over the same span.
type MixedOptions struct {
	BatchRequests    int
	BatchPromptWords int
	BatchMaxTokens   int
	// MaxConcurrency is the concurrency-detector's in-flight requests per
	// server at saturation; HoldbackMinCeiling the priority-holdback
	// ceiling of the batch band (0: strict priority only); RequestTTL how
	// long a queued request may wait.
	MaxConcurrency     int
	HoldbackMinCeiling float64
	RequestTTL         time.Duration
	// EnginePriority adds a scenario: the batch job beside online traffic
	// without flow control, the simulators at --scheduling-policy priority
	// and the picker writing each objective's priority into the body
	// (--engine-priority), so that the engines' own queues put online
	// first.
	EnginePriority bool
}

// DefaultMixedOptions: at the default time scale the batch job alone keeps
// every server's batch full for the whole run.
func DefaultMixedOptions() MixedOptions {
	return MixedOptions{BatchRequests: 600, BatchPromptWords: 256, BatchMaxTokens: 32,
		MaxConcurrency: 12, HoldbackMinCeiling: 0.5, RequestTTL: 15 * time.Second}
}

// The objectives of the mixed scenario: online traffic is critical, the
// batch job sheddable (negative priority), as llm-d's flow-control guide
// sets them.
const (
	objectiveOnline = "online"
	objectiveBatch  = "batch"
	priorityOnline  = 100
	priorityBatch   = -1
)

// mixedScenario is one fleet of the comparison.
type mixedScenario struct {
	name           string
	batch          bool
	flowControl    bool
	enginePriority bool
}

// mixedScenarios: online alone is the reference (first); the batch job beside it
// with and without the flow-control layer.
var mixedScenarios = []mixedScenario{
	{name: "online-only", flowControl: true},
	{name: "mixed-flow-control", batch: true, flowControl: true},
	{name: "mixed-no-flow-control", batch: true},
}

// enginePriorityScenario is the scenario MixedOptions.EnginePriority adds.
var enginePriorityScenario = mixedScenario{name: "mixed-engine-priority", batch: true, enginePriority: true}

// scenarios are the fleets a run compares, online alone first.
func (m MixedOptions) scenarios() []mixedScenario {
	if m.EnginePriority {
		return append(slices.Clip(mixedScenarios), enginePriorityScenario)
	}
	return mixedScenarios
}

// enginePriorityArgs run a fleet's engines by priority, with the picker
// setting each request's from its objective; the picker needs the body for
// that, which policies that route on headers alone do not send it.
func enginePriorityArgs(c *StackConfig) {
	c.SimArgs = append(c.SimArgs, "--scheduling-policy=priority")
	c.EPPArgs = append(c.EPPArgs, "--engine-priority")
	if !readsBody(c.Policy) {
		c.GatewayArgs = append(slices.Clip(c.GatewayArgs), "--request-body-mode=full-duplex-streamed")
	}
}

// classOutcome is one traffic class of one scenario.
type classOutcome struct {
	Scenario    string `json:"scenario"`
	FlowControl bool   `json:"flow_control"`
	// EnginePriority: the engines scheduled by the body's priority.
	EnginePriority bool           `json:"engine_priority,omitempty"`
	Class          string         `json:"class"`
	Summary        report.Summary `json:"summary"`
	Shed           int            `json:"shed"`
}

// runMixed runs each scenario on a fresh fleet and compares the classes.
func runMixed(ctx context.Context, o Options, online []workload.Request, stdout io.Writer, tty bool) error {
	m := o.Mixed
	batch := workload.Batch(m.BatchRequests, m.BatchPromptWords, m.BatchMaxTokens, o.Workload.Duration, 0x62617463) // "batc"
	objectives := filepath.Join(o.Out, "objectives.yaml")
	if err := os.WriteFile(objectives, []byte(objectivesYAML()), 0o644); err != nil {
		return fmt.Errorf("objectives: %w", err)
	}
	fc := &config.PolicyFlowControl{MaxConcurrency: m.MaxConcurrency, HoldbackMinCeiling: m.HoldbackMinCeiling, RequestTTL: m.RequestTTL}
	fmt.Fprintf(stdout, "kvgate up --mixed: %d simulated %s servers, policy %s; online: %d trace requests (objective %q, priority %d); batch: %d requests of %d words → %d tokens (objective %q, priority %d), both over %s\n",
		o.Replicas, Model, o.Policy, len(online), objectiveOnline, priorityOnline, len(batch), m.BatchPromptWords, m.BatchMaxTokens, objectiveBatch, priorityBatch, o.Workload.Duration)
	fmt.Fprintf(stdout, "flow control: concurrency-detector maxConcurrency %d per server, priority-holdback minCeiling %g, defaultRequestTTL %s\noutput: %s\n",
		m.MaxConcurrency, m.HoldbackMinCeiling, m.RequestTTL, o.Out)
	if m.EnginePriority {
		fmt.Fprintf(stdout, "%s: no flow control, engines at --scheduling-policy priority, picker at --engine-priority\n", enginePriorityScenario.name)
	}

	var outcomes []classOutcome
	var runs []report.Run
	for _, sc := range m.scenarios() {
		c := StackConfig{
			Bin: o.Bin, Wasm: o.Wasm, TokenizerDir: o.TokenizerDir, Replicas: o.Replicas, Policy: o.Policy,
			Objectives: objectives, LogDir: filepath.Join(o.Out, "logs", sc.name), TimeScale: o.TimeScale,
			NumGPUBlocks: o.NumGPUBlocks, HashSeed: kvhash.DefaultSeed, GatewayArgs: o.GatewayArgs, Ready: 60 * time.Second,
			Progress: func(s string) { fmt.Fprintf(stdout, "[%s]   %s\n", sc.name, s) },
		}
		if sc.flowControl {
			c.FlowControl = fc
		}
		if sc.enginePriority {
			enginePriorityArgs(&c)
		}
		streams := map[string][]workload.Request{objectiveOnline: online}
		if sc.batch {
			streams[objectiveBatch] = batch
		}
		res, err := runScenario(ctx, c, sc.name, streams, stdout, tty)
		if err != nil {
			return err
		}
		for _, class := range []string{objectiveOnline, objectiveBatch} {
			r, ok := res[class]
			if !ok {
				continue
			}
			run := report.Run{Policy: sc.name + "/" + class, Wall: r.wall, Results: r.results}
			runs = append(runs, run)
			outcomes = append(outcomes, classOutcome{Scenario: sc.name, FlowControl: sc.flowControl, EnginePriority: sc.enginePriority, Class: class, Summary: report.Summarize(run), Shed: shed(r.results)})
		}
	}
	fmt.Fprintln(stdout)
	writeMixedTable(stdout, outcomes)
	verdict := mixedVerdict(m.scenarios(), outcomes)
	fmt.Fprintln(stdout)
	for _, line := range verdict {
		fmt.Fprintln(stdout, line)
	}
	if err := writeMixedOutputs(o, fc, outcomes, runs, verdict); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nreport:  %s\nresults: %s\nlogs:    %s\n", filepath.Join(o.Out, "report.html"),
		filepath.Join(o.Out, "results.json"), filepath.Join(o.Out, "logs"))
	// Online traffic is never shed or lost under flow control; the batch
	// job may be (that is its contract), and without flow control anything
	// may time out, which the table shows.
	for _, oc := range outcomes {
		if oc.Class == objectiveOnline && oc.FlowControl && oc.Summary.Errors > 0 {
			return fmt.Errorf("%s: %d of %d online requests failed (see results.json)", oc.Scenario, oc.Summary.Errors, oc.Summary.Requests)
		}
	}
	return nil
}

// streamResult is one class's replay.
type streamResult struct {
	results []workload.Result
	wall    time.Duration
}

// runScenario starts a fleet, replays every class's stream through it at
// once, each with its objective header, and stops the fleet.
func runScenario(ctx context.Context, c StackConfig, name string, streams map[string][]workload.Request, stdout io.Writer, tty bool) (map[string]streamResult, error) {
	fmt.Fprintf(stdout, "\n[%s] starting %d sims, epp and gateway...\n", name, c.Replicas)
	stack, err := StartStack(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("%s fleet: %w", name, err)
	}
	defer stack.Close()
	rctx, cancel := untilExit(ctx, stack)
	defer cancel(nil)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	total := 0
	for _, s := range streams {
		total += len(s)
	}
	bar := newProgress(stdout, tty, name, total)
	start := time.Now()
	var finished atomic.Int64
	out := make(map[string]streamResult, len(streams))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for class, reqs := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := workload.Target{URL: stack.GatewayURL + "/v1/completions", Model: Model, Client: client,
				Header: http.Header{http.CanonicalHeaderKey(eppwire.HeaderObjective): {class}}}
			t0 := time.Now()
			res := workload.Replay(rctx, t, reqs, func(int) { bar.update(int(finished.Add(1))) })
			mu.Lock()
			out[class] = streamResult{results: res, wall: time.Since(t0)}
			mu.Unlock()
		}()
	}
	wg.Wait()
	bar.finish(time.Since(start))
	if err := context.Cause(rctx); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%s run: %w", name, err)
	}
	return out, nil
}

// shed counts the requests the picker refused by policy: 429 (saturated,
// or its queue TTL expired) and 503 (no capacity), flow control's outcomes.
func shed(results []workload.Result) int {
	n := 0
	for _, r := range results {
		if r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable {
			n++
		}
	}
	return n
}

func writeMixedTable(w io.Writer, outcomes []classOutcome) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tclass\trequests\tserved\tshed\tTTFT p50\tTTFT p90\tTTFT p99\tout tok/s")
	for _, oc := range outcomes {
		s := oc.Summary
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%.0f\n", oc.Scenario, oc.Class, s.Requests, s.Requests-s.Errors, oc.Shed,
			report.Millis(s.TTFTP50), report.Millis(s.TTFTP90), report.Millis(s.TTFTP99), s.OutputTokensPerSec)
	}
	tw.Flush()
}

// mixedVerdict states the comparison the scenario exists for: how much the
// batch job slowed online traffic with and without flow control, and how
// much of the batch job each served.
func mixedVerdict(scenarios []mixedScenario, outcomes []classOutcome) []string {
	get := func(scenario, class string) (report.Summary, bool) {
		for _, oc := range outcomes {
			if oc.Scenario == scenario && oc.Class == class {
				return oc.Summary, true
			}
		}
		return report.Summary{}, false
	}
	alone, ok := get(scenarios[0].name, objectiveOnline)
	if !ok || alone.TTFTP90 <= 0 {
		return nil
	}
	var lines []string
	for _, scenario := range scenarios[1:] {
		sc := scenario.name
		on, ok1 := get(sc, objectiveOnline)
		b, ok2 := get(sc, objectiveBatch)
		if !ok1 || !ok2 {
			continue
		}
		lines = append(lines, fmt.Sprintf("%s: online p90 TTFT %s = %.2f× online alone (%s); batch served %d of %d at %.0f output tok/s",
			sc, report.Millis(on.TTFTP90), on.TTFTP90/alone.TTFTP90, report.Millis(alone.TTFTP90), b.Requests-b.Errors, b.Requests, b.OutputTokensPerSec))
	}
	fcfs, ok1 := get(mixedScenarios[2].name, objectiveOnline)
	prio, ok2 := get(enginePriorityScenario.name, objectiveOnline)
	if ok1 && ok2 && fcfs.TTFTP90 > 0 {
		lines = append(lines, fmt.Sprintf("%s against %s (both without flow control): online p90 TTFT %.2f×, p50 %.2f×",
			enginePriorityScenario.name, mixedScenarios[2].name, prio.TTFTP90/fcfs.TTFTP90, ratio(prio.TTFTP50, fcfs.TTFTP50)))
	}
	return lines
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func objectivesYAML() string {
	var b strings.Builder
	for _, o := range []struct {
		name     string
		priority int
	}{{objectiveOnline, priorityOnline}, {objectiveBatch, priorityBatch}} {
		fmt.Fprintf(&b, "---\napiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata:\n  name: %s\nspec:\n  priority: %d\n  poolRef:\n    name: %s\n",
			o.name, o.priority, ObjectivesPool)
	}
	return b.String()
}

func writeMixedOutputs(o Options, fc *config.PolicyFlowControl, outcomes []classOutcome, runs []report.Run, verdict []string) error {
	if err := writeJSON(filepath.Join(o.Out, "results.json"), map[string]any{"options": o, "classes": outcomes, "runs": runs}); err != nil {
		return err
	}
	setup := []string{
		fmt.Sprintf("%d simulated vLLM servers (%s, preset qwen3-0.6b-h100, time scale %g, %d KV blocks of %d tokens each), policy %s, one fresh fleet per scenario",
			o.Replicas, Model, o.TimeScale, o.NumGPUBlocks, kvhash.DefaultBlockSize, o.Policy),
		fmt.Sprintf("online: %d requests from the Mooncake trace over %s, objective %q (priority %d)", o.Requests, o.Workload.Duration, objectiveOnline, priorityOnline),
		fmt.Sprintf("batch: %d synthetic requests (%d words, %d output tokens, no shared prefixes) over the same span, objective %q (priority %d, sheddable)",
			o.Mixed.BatchRequests, o.Mixed.BatchPromptWords, o.Mixed.BatchMaxTokens, objectiveBatch, priorityBatch),
		fmt.Sprintf("flow control (online-only and mixed-flow-control): concurrency-detector maxConcurrency %d, priority-holdback-policy minCeiling %g, defaultRequestTTL %s",
			fc.MaxConcurrency, fc.HoldbackMinCeiling, fc.RequestTTL),
	}
	if o.Mixed.EnginePriority {
		setup = append(setup, fmt.Sprintf("%s: no flow control; simulators at --scheduling-policy priority, the picker at --engine-priority (body priority = -objective priority: online %d, batch %d)",
			enginePriorityScenario.name, -priorityOnline, -priorityBatch))
	}
	setup = append(setup, verdict...)
	sums := make([]report.Summary, len(outcomes))
	for i, oc := range outcomes {
		sums[i] = oc.Summary
	}
	return writeHTML(filepath.Join(o.Out, "report.html"), report.Page{Title: "kvgate up --mixed: online traffic beside a batch job", Generated: time.Now(), Setup: setup, Runs: runs, Summaries: sums})
}
