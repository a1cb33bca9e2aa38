package benchmarks

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/sim/engine"
)

// `kvgate bench pd`: P/D disaggregation on the simulated cluster. Fleets of
// one GPU count run collocated (every server prefills and decodes) or as
// xPyD (x prefill servers, y decode servers that may also prefill
// locally), with a network model between the servers; a decider chooses per
// request. Three scenarios:
//
//   - tradeoff: collocated vs xPyD with always-disagg-pd-decider and with
//     transfer-cost-pd-decider, on a long-prompt and a short-prompt
//     workload, over a fast and a slow network: where P/D pays and where
//     it does not.
//   - sweep: a mixed workload (prompt lengths from 128 to 16k tokens, half
//     of them behind one of a few shared prefixes) over networks of
//     several speeds, one with paths of different speeds, deciding with
//     transfer-cost-pd-decider and with prefix-based-pd-decider at each
//     threshold.
//   - capacity: the tradeoff's fleets on its long-prompt workload over the
//     fast and the slow network at several arrival rates, and per fleet the
//     highest rate whose TTFT p90 and TPOT p90 meet an SLO: the throughput
//     P/D buys (or costs) at the same latency, which one open-loop rate
//     where no fleet saturates cannot show.

// PDOptions are `kvgate bench pd`'s flags.
type PDOptions struct {
	Out       string
	Scenario  string
	Preset    string
	GPUs      int
	Prefill   int
	Requests  int
	Seed      uint64
	QPSLong   float64
	QPSShort  float64
	QPSMixed  float64
	FastBW    float64
	SlowBW    float64
	Latency   time.Duration
	Threshold string
	// Rates are the capacity scenario's arrival rates, as multiples of
	// QPSLong; SLOTTFT and SLOTPOT the p90 bounds a rate must meet.
	Rates            string
	SLOTTFT, SLOTPOT time.Duration
}

// DefaultPDOptions are the flag defaults.
func DefaultPDOptions() PDOptions {
	return PDOptions{Scenario: "all", Preset: "llama-3.1-8b-h100", GPUs: 4, Prefill: 2, Requests: 300, Seed: 1,
		QPSLong: 6, QPSShort: 40, QPSMixed: 8, FastBW: 50e9, SlowBW: 1.25e9, Latency: 50 * time.Microsecond,
		Threshold: "16,512,2048,8192", Rates: "0.5,0.75,1,1.25,1.5,1.75,2,2.5,3", SLOTTFT: time.Second, SLOTPOT: 25 * time.Millisecond}
}

// PDMain is `kvgate bench pd`.
func PDMain(ctx context.Context, args []string, stderr io.Writer) error {
	o := DefaultPDOptions()
	fs := flag.NewFlagSet("kvgate bench pd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Out, "out", o.Out, "directory for pd.md (required)")
	fs.StringVar(&o.Scenario, "scenario", o.Scenario, "tradeoff | sweep | all (tradeoff and sweep) | capacity")
	fs.StringVar(&o.Preset, "preset", o.Preset, "engine preset: "+presetNames())
	fs.IntVar(&o.GPUs, "gpus", o.GPUs, "servers (GPUs) in every fleet")
	fs.IntVar(&o.Prefill, "prefill", o.Prefill, "prefill servers of the xPyD fleets (x; y = --gpus - x)")
	fs.IntVar(&o.Requests, "requests", o.Requests, "requests per run")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the workloads and the picker")
	fs.Float64Var(&o.QPSLong, "qps-long", o.QPSLong, "tradeoff: arrival rate of the long-prompt workload")
	fs.Float64Var(&o.QPSShort, "qps-short", o.QPSShort, "tradeoff: arrival rate of the short-prompt workload")
	fs.Float64Var(&o.QPSMixed, "qps-mixed", o.QPSMixed, "sweep: arrival rate of the mixed workload")
	fs.Float64Var(&o.FastBW, "fast-bw", o.FastBW, "bytes/s of a fast path (default 400 Gb/s)")
	fs.Float64Var(&o.SlowBW, "slow-bw", o.SlowBW, "bytes/s of a slow path (default 10 Gb/s)")
	fs.DurationVar(&o.Latency, "latency", o.Latency, "one-way latency of every path")
	fs.StringVar(&o.Threshold, "thresholds", o.Threshold, "sweep: prefix-based-pd-decider nonCachedTokens values")
	fs.StringVar(&o.Rates, "rates", o.Rates, "capacity: arrival rates of the long-prompt workload, as multiples of --qps-long")
	fs.DurationVar(&o.SLOTTFT, "slo-ttft", o.SLOTTFT, "capacity: the TTFT p90 a rate must meet")
	fs.DurationVar(&o.SLOTPOT, "slo-tpot", o.SLOTPOT, "capacity: the TPOT p90 a rate must meet")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	thresholds, rates, err := o.check()
	if err != nil {
		fmt.Fprintln(stderr, err)
		fs.Usage()
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	preset, _ := engine.LookupPreset(o.Preset)
	var b strings.Builder
	fmt.Fprintf(&b, "Preset %s, %d GPUs per fleet (xPyD: %dP%dD), %d requests per run, seed %d; network paths %.3g B/s (fast) / %.3g B/s (slow), %v latency.\n",
		o.Preset, o.GPUs, o.Prefill, o.GPUs-o.Prefill, o.Requests, o.Seed, o.FastBW, o.SlowBW, o.Latency)
	if o.Scenario == "tradeoff" || o.Scenario == "all" {
		rows, err := o.tradeoff(ctx, preset, stderr)
		if err != nil {
			return err
		}
		b.WriteString("\n" + pdTable(rows))
	}
	if o.Scenario == "sweep" || o.Scenario == "all" {
		rows, err := o.sweep(ctx, preset, thresholds, stderr)
		if err != nil {
			return err
		}
		b.WriteString("\n" + pdTable(rows))
	}
	if o.Scenario == "capacity" {
		rows, err := o.capacity(ctx, preset, rates, stderr)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "\nCapacity: the long-prompt workload at %s req/s; SLO TTFT p90 <= %v and TPOT p90 <= %v.\n\n%s\n%s",
			joinRates(rows), o.SLOTTFT, o.SLOTPOT, capacityTable(rows, o.slo()), pdTable(rows))
	}
	fmt.Fprint(stderr, "\n", b.String())
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.Out, "pd.md"), []byte(b.String()), 0o644)
}

// check validates the options and returns the sweep's thresholds and the
// capacity scenario's rate multiples.
func (o PDOptions) check() ([]int, []float64, error) {
	if o.Out == "" {
		return nil, nil, errors.New("--out is required")
	}
	switch o.Scenario {
	case "tradeoff", "sweep", "all", "capacity":
	default:
		return nil, nil, fmt.Errorf("--scenario %q: want tradeoff, sweep, all or capacity", o.Scenario)
	}
	if _, ok := engine.LookupPreset(o.Preset); !ok {
		return nil, nil, fmt.Errorf("unknown preset %q (%s)", o.Preset, presetNames())
	}
	switch {
	case o.GPUs < 2 || o.GPUs > 64:
		return nil, nil, fmt.Errorf("--gpus must be 2..64, got %d", o.GPUs)
	case o.Prefill < 1 || o.Prefill >= o.GPUs:
		return nil, nil, fmt.Errorf("--prefill must be 1..%d, got %d", o.GPUs-1, o.Prefill)
	case o.Requests < 1:
		return nil, nil, errors.New("--requests must be positive")
	case !(o.QPSLong > 0 && o.QPSShort > 0 && o.QPSMixed > 0):
		return nil, nil, errors.New("arrival rates must be positive")
	case !(o.FastBW > 0 && o.SlowBW > 0) || o.Latency < 0:
		return nil, nil, errors.New("path bandwidths must be positive and the latency not negative")
	case o.SLOTTFT <= 0 || o.SLOTPOT <= 0:
		return nil, nil, errors.New("--slo-ttft and --slo-tpot must be positive")
	}
	thresholds, err := positives[int]("--thresholds", "token count", o.Threshold)
	if err != nil {
		return nil, nil, err
	}
	rates, err := positives[float64]("--rates", "rate multiple", o.Rates)
	if err != nil {
		return nil, nil, err
	}
	if !slices.IsSorted(rates) || len(slices.Compact(slices.Clone(rates))) != len(rates) {
		return nil, nil, fmt.Errorf("--rates %q: want increasing multiples", o.Rates)
	}
	return thresholds, rates, nil
}

// positives parses a comma-separated list of positive numbers.
func positives[T int | float64](flagName, what, list string) ([]T, error) {
	var out []T
	for _, s := range strings.Split(list, ",") {
		var n T
		if _, err := fmt.Sscan(strings.TrimSpace(s), &n); err != nil || !(n > 0) {
			return nil, fmt.Errorf("%s: %q is not a positive %s", flagName, s, what)
		}
		out = append(out, n)
	}
	return out, nil
}

// pdRow is one run.
type pdRow struct {
	Fleet, Decider, Workload, Network string
	QPS                               float64
	OK, Failed                        int
	TTFTP50, TTFTP90, TTFTMean        float64
	TPOTP50, TPOTP90                  float64
	// E2EMean is the mean request latency, arrival to last token.
	E2EMean float64
	OutTokS float64
	// Disagg is the share of requests prefilled on another server;
	// DisaggBy the same by prompt length (pdBuckets).
	Disagg   float64
	DisaggBy [len(pdBuckets)]float64
	// TTFTBy is the mean TTFT by prompt length (pdBuckets), -1 for a
	// bucket without requests: which requests a decider's mean is won or
	// lost on.
	TTFTBy [len(pdBuckets)]float64
}

// pdBuckets are the prompt lengths the decider's choices are shown by:
// below 1k tokens, below 4k, the rest.
var pdBuckets = [...]int{1024, 4096, math.MaxInt}

func bucket(prompt int) int {
	for i, b := range pdBuckets {
		if prompt < b {
			return i
		}
	}
	return len(pdBuckets) - 1
}

func pdTable(rows []pdRow) string {
	var b strings.Builder
	b.WriteString("| fleet | decider | workload | network | QPS | ok | TTFT p50 | TTFT p90 | TTFT mean | TPOT p50 | TPOT p90 | E2E mean | out tok/s | P/D share | P/D <1k / 1k-4k / 4k+ | TTFT mean <1k / 1k-4k / 4k+ |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.3g | %d/%d | %.3fs | %.3fs | %.3fs | %.1fms | %.1fms | %.2fs | %.0f | %.0f%% | %s | %s |\n",
			r.Fleet, r.Decider, r.Workload, r.Network, r.QPS, r.OK, r.OK+r.Failed, r.TTFTP50, r.TTFTP90, r.TTFTMean,
			r.TPOTP50*1e3, r.TPOTP90*1e3, r.E2EMean, r.OutTokS, 100*r.Disagg, shares(r.DisaggBy), seconds3(r.TTFTBy))
	}
	return b.String()
}

// pdNetwork is a named network model for a fleet whose first prefill
// servers are the prefill ones.
type pdNetwork struct {
	name string
	net  func(gpus, prefill int) *cluster.Network
}

func (o PDOptions) uniform(name string, bw float64) pdNetwork {
	return pdNetwork{name, func(int, int) *cluster.Network {
		return &cluster.Network{Default: cluster.Path{BytesPerSecond: bw, Latency: o.Latency}}
	}}
}

// split gives the first prefill server fast paths and the others slow
// ones, to every decode server.
func (o PDOptions) split() pdNetwork {
	return pdNetwork{"split", func(gpus, prefill int) *cluster.Network {
		n := &cluster.Network{Default: cluster.Path{BytesPerSecond: o.FastBW, Latency: o.Latency}, Pairs: map[[2]int]cluster.Path{}}
		for p := 1; p < prefill; p++ {
			for d := prefill; d < gpus; d++ {
				n.Pairs[[2]int{p, d}] = cluster.Path{BytesPerSecond: o.SlowBW, Latency: o.Latency}
			}
		}
		return n
	}}
}

// pdFleet is a fleet layout and its decider.
type pdFleet struct {
	name, decider string
	prefill       int // 0: collocated
	config        []byte
}

func (o PDOptions) fleets(preset engine.Preset, deciders ...string) ([]pdFleet, error) {
	var out []pdFleet
	for _, d := range deciders {
		name := fmt.Sprintf("%dP%dD", o.Prefill, o.GPUs-o.Prefill)
		if d == "" {
			c, err := config.Policy(config.PolicyPrecise, config.PolicyOptions{BlockSize: kvhash.DefaultBlockSize, HashSeed: kvhash.DefaultSeed})
			if err != nil {
				return nil, err
			}
			out = append(out, pdFleet{name: fmt.Sprintf("%d collocated", o.GPUs), decider: "— (precise)", config: c})
			continue
		}
		out = append(out, pdFleet{name: name, decider: d, prefill: o.Prefill, config: pdConfig(d, hardware(preset))})
	}
	return out, nil
}

// hardware is the transfer-cost decider's description of the preset's
// servers, as an operator would configure it from the hardware: the KV
// bytes of a token and the prefill rates, per token and per attention pair,
// of the preset's step time.
func hardware(preset engine.Preset) string {
	const n = 2048
	pairs := float64(n) * float64(n+1) / 2
	linear := preset.StepDuration(engine.Shape{PrefillTokens: n, SampledSeqs: 1, ContextTokens: n}).Seconds()
	quadratic := preset.StepDuration(engine.Shape{PrefillTokens: n, SampledSeqs: 1, ContextTokens: n, AttentionPairs: pairs}).Seconds() - linear
	attention := 0.0
	if quadratic > 0 {
		attention = pairs / quadratic
	}
	return fmt.Sprintf("kvBytesPerToken: %d, prefillTokensPerSecond: %.6g, prefillAttentionPairsPerSecond: %.6g",
		preset.Model.KVBytesPerToken(), n/linear, attention)
}

// pdConfig is the xPyD policy: kvgate's precise profile in the decode and
// prefill profiles, and the decider (a plugin spec's type and parameters,
// "type" or "type{json}"). The transfer-cost decider also scores the
// decode and the prefill servers by its costs, and is given the servers'
// hardware.
func pdConfig(decider, hardware string) []byte {
	typ, params, _ := strings.Cut(decider, "{")
	prefillScorer, decodeScorer := "latency-scorer", "latency-scorer"
	if typ == "transfer-cost-pd-decider" {
		prefillScorer, decodeScorer = typ, typ
		if params == "" {
			params = "}"
		} else {
			params = ", " + params
		}
		params = hardware + params
	}
	if params != "" {
		params = "\n  parameters: {" + params
	}
	return []byte(fmt.Sprintf(`apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters: {blockSize: %d, hashSeed: %q, speculativeIndexing: true}
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: latency-scorer
  parameters: {ttftWeight: 1, tpotWeight: 0}
- type: decode-filter
- type: prefill-filter
- type: max-score-picker
- type: %s%s
- type: disagg-profile-handler
  parameters: {deciders: {prefill: %s}}
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: %s}, {pluginRef: max-score-picker}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: %s}, {pluginRef: max-score-picker}]
`, kvhash.DefaultBlockSize, kvhash.DefaultSeed, typ, params, typ, decodeScorer, prefillScorer))
}

// pdWorkload generates n requests at qps: prompt lengths from prompt,
// output lengths from out, and a shared prefix of the given length (one of
// groups) for a share of them.
func pdWorkload(seed uint64, n int, qps float64, prompt, out func(*rand.Rand) int, shared float64, groups, prefixLen int) []workload.Request {
	rng := rand.New(rand.NewPCG(seed, 0x9d))
	reqs := make([]workload.Request, n)
	at := 0.0
	for i := range reqs {
		at += rng.ExpFloat64() / qps
		r := workload.Request{Arrival: time.Duration(at * float64(time.Second)), OutputTokens: out(rng), OfferedQPS: qps}
		if groups > 0 && rng.Float64() < shared {
			r.Segments = append(r.Segments, workload.Segment{Key: 0x5eed0000 + uint64(rng.IntN(groups)), Len: prefixLen})
		}
		r.Segments = append(r.Segments, workload.Segment{Key: seed<<32 | uint64(i+1), Len: prompt(rng)})
		reqs[i] = r
	}
	return reqs
}

func fixedLen(n int) func(*rand.Rand) int { return func(*rand.Rand) int { return n } }

// logUniform draws from [lo, hi] uniformly in the logarithm.
func logUniform(lo, hi int) func(*rand.Rand) int {
	return func(r *rand.Rand) int {
		return int(math.Round(float64(lo) * math.Pow(float64(hi)/float64(lo), r.Float64())))
	}
}

func uniformLen(lo, hi int) func(*rand.Rand) int {
	return func(r *rand.Rand) int { return lo + r.IntN(hi-lo+1) }
}

// shares writes the per-bucket shares; "–" for a bucket without requests.
func shares(by [len(pdBuckets)]float64) string {
	parts := make([]string, len(by))
	for i, v := range by {
		parts[i] = "–"
		if v >= 0 {
			parts[i] = fmt.Sprintf("%.0f%%", 100*v)
		}
	}
	return strings.Join(parts, " / ")
}

// seconds3 writes the per-bucket mean TTFTs; "–" for a bucket without
// requests.
func seconds3(by [len(pdBuckets)]float64) string {
	parts := make([]string, len(by))
	for i, v := range by {
		parts[i] = "–"
		if v >= 0 {
			parts[i] = fmt.Sprintf("%.3f", v)
		}
	}
	return strings.Join(parts, " / ") + "s"
}

func (o PDOptions) run(ctx context.Context, preset engine.Preset, f pdFleet, net pdNetwork, wname string, qps float64, reqs []workload.Request, stderr io.Writer) (pdRow, error) {
	co := cluster.Options{Replicas: o.GPUs, Preset: preset, Seed: o.Seed}
	row := pdRow{Fleet: f.name, Decider: f.decider, Workload: wname, Network: net.name, QPS: qps}
	if f.prefill > 0 {
		co.Roles = make([]string, o.GPUs)
		for i := range co.Roles {
			co.Roles[i] = "decode"
			if i < f.prefill {
				co.Roles[i] = "prefill"
			}
		}
		co.Network = net.net(o.GPUs, f.prefill)
	} else {
		row.Network = "—"
	}
	start := time.Now()
	res, err := cluster.Run(ctx, co, cluster.Policy{Name: f.name, Config: f.config}, reqs)
	if err != nil {
		return row, fmt.Errorf("%s %s %s: %w", f.name, f.decider, wname, err)
	}
	var ttft, tpot, e2e []float64
	var output int64
	disagg := 0
	var by, of [len(pdBuckets)]int
	var ttftSum [len(pdBuckets)]float64
	first, end := time.Duration(math.MaxInt64), time.Duration(0)
	for _, r := range res.Requests {
		first = min(first, r.Arrival)
		if r.Err != "" {
			row.Failed++
			continue
		}
		row.OK++
		ttft = append(ttft, r.TTFT.Seconds())
		e2e = append(e2e, r.E2E.Seconds())
		if r.OutputTokens > 1 {
			tpot = append(tpot, r.TPOT.Seconds())
		}
		output += int64(r.OutputTokens)
		end = max(end, r.Arrival+r.E2E)
		k := bucket(r.PromptTokens)
		of[k]++
		ttftSum[k] += r.TTFT.Seconds()
		if r.Prefill >= 0 {
			disagg++
			by[k]++
		}
	}
	slices.Sort(ttft)
	slices.Sort(tpot)
	row.TTFTP50, row.TTFTP90, row.TTFTMean = pct(ttft, 50), pct(ttft, 90), mean(ttft)
	row.TPOTP50, row.TPOTP90, row.E2EMean = pct(tpot, 50), pct(tpot, 90), mean(e2e)
	if span := (end - first).Seconds(); span > 0 {
		row.OutTokS = float64(output) / span
	}
	if row.OK > 0 {
		row.Disagg = float64(disagg) / float64(row.OK)
	}
	for k := range by {
		row.DisaggBy[k], row.TTFTBy[k] = -1, -1
		if of[k] > 0 {
			row.DisaggBy[k] = float64(by[k]) / float64(of[k])
			row.TTFTBy[k] = ttftSum[k] / float64(of[k])
		}
	}
	fmt.Fprintf(stderr, "%-14s %-44s %-6s %-6s TTFT p50 %6.3fs p90 %6.3fs  TPOT p50 %5.1fms  P/D %3.0f%%  wall %.1fs\n",
		row.Fleet, row.Decider, row.Workload, row.Network, row.TTFTP50, row.TTFTP90, row.TPOTP50*1e3, 100*row.Disagg, time.Since(start).Seconds())
	return row, nil
}

// tradeoffDeciders are the fleets the tradeoff and the capacity scenarios
// compare: "" the collocated fleet, the others xPyD with that decider.
var tradeoffDeciders = []string{"", "always-disagg-pd-decider", "transfer-cost-pd-decider", "transfer-cost-pd-decider{interferenceWeight: 1}", "transfer-cost-pd-decider{interferenceWeight: 0}"}

// longPrompts is the long-prompt workload at qps: 8000-token prompts, 256
// tokens out. At one seed, a higher rate is the same requests arriving
// closer together.
func (o PDOptions) longPrompts(qps float64) []workload.Request {
	return pdWorkload(o.Seed, o.Requests, qps, fixedLen(8000), fixedLen(256), 0, 0, 0)
}

// fastSlow are the tradeoff's networks, every path fast or every path slow.
func (o PDOptions) fastSlow() []pdNetwork {
	return []pdNetwork{o.uniform("fast", o.FastBW), o.uniform("slow", o.SlowBW)}
}

// tradeoff runs collocated and xPyD fleets on long and short prompts over
// a fast and a slow network.
func (o PDOptions) tradeoff(ctx context.Context, preset engine.Preset, stderr io.Writer) ([]pdRow, error) {
	fleets, err := o.fleets(preset, tradeoffDeciders...)
	if err != nil {
		return nil, err
	}
	workloads := []struct {
		name string
		qps  float64
		reqs []workload.Request
	}{
		{"long", o.QPSLong, o.longPrompts(o.QPSLong)},
		{"short", o.QPSShort, pdWorkload(o.Seed, o.Requests, o.QPSShort, fixedLen(256), fixedLen(256), 0, 0, 0)},
	}
	var rows []pdRow
	for _, w := range workloads {
		for _, f := range fleets {
			for _, n := range o.fastSlow() {
				row, err := o.run(ctx, preset, f, n, w.name, w.qps, w.reqs, stderr)
				if err != nil {
					return nil, err
				}
				rows = append(rows, row)
				if f.prefill == 0 {
					break // a collocated fleet moves no KV
				}
			}
		}
	}
	return rows, nil
}

// sweep runs the mixed workload over networks of several speeds with
// transfer-cost-pd-decider and prefix-based-pd-decider at each threshold.
func (o PDOptions) sweep(ctx context.Context, preset engine.Preset, thresholds []int, stderr io.Writer) ([]pdRow, error) {
	deciders := []string{"transfer-cost-pd-decider", "transfer-cost-pd-decider{interferenceWeight: 1}", "transfer-cost-pd-decider{interferenceWeight: 0}", "transfer-cost-pd-decider{interferenceWeight: 0, queueWeight: 1}",
		"transfer-cost-pd-decider{interferenceWeight: 0, decodeStallWeight: 1, queueWeight: 1}"}
	for _, t := range thresholds {
		deciders = append(deciders, fmt.Sprintf("prefix-based-pd-decider{nonCachedTokens: %d}", t))
	}
	fleets, err := o.fleets(preset, deciders...)
	if err != nil {
		return nil, err
	}
	reqs := pdWorkload(o.Seed, o.Requests, o.QPSMixed, logUniform(128, 16384), uniformLen(64, 512), 0.5, 4, 4096)
	nets := []pdNetwork{o.uniform("fast", o.FastBW), o.uniform("medium", math.Sqrt(o.FastBW*o.SlowBW)), o.uniform("slow", o.SlowBW)}
	if o.Prefill > 1 {
		nets = append(nets, o.split())
	}
	var rows []pdRow
	for _, n := range nets {
		for _, f := range fleets {
			row, err := o.run(ctx, preset, f, n, "mixed", o.QPSMixed, reqs, stderr)
			if err != nil {
				return nil, err
			}
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// capacity runs the tradeoff's fleets on the long-prompt workload over the
// fast and the slow network at each multiple of QPSLong, in order of fleet,
// network and rate; a collocated fleet, which moves no KV, once per rate.
func (o PDOptions) capacity(ctx context.Context, preset engine.Preset, rates []float64, stderr io.Writer) ([]pdRow, error) {
	fleets, err := o.fleets(preset, tradeoffDeciders...)
	if err != nil {
		return nil, err
	}
	var rows []pdRow
	for _, f := range fleets {
		for _, n := range o.fastSlow() {
			for _, m := range rates {
				qps := m * o.QPSLong
				row, err := o.run(ctx, preset, f, n, "long", qps, o.longPrompts(qps), stderr)
				if err != nil {
					return nil, err
				}
				rows = append(rows, row)
			}
			if f.prefill == 0 {
				break
			}
		}
	}
	return rows, nil
}

// pdSLO is a latency objective, in seconds; +Inf leaves a bound out.
type pdSLO struct{ ttftP90, tpotP90 float64 }

func (o PDOptions) slo() pdSLO { return pdSLO{o.SLOTTFT.Seconds(), o.SLOTPOT.Seconds()} }

// met: every request served, within both bounds.
func (s pdSLO) met(r pdRow) bool {
	return r.Failed == 0 && r.OK > 0 && r.TTFTP90 <= s.ttftP90 && r.TPOTP90 <= s.tpotP90
}

// capacityOf is the run at the highest rate of one fleet's runs (in
// increasing rate) that met the SLO with every lower rate meeting it too,
// and false when the lowest did not.
func capacityOf(runs []pdRow, s pdSLO) (pdRow, bool) {
	best, ok := pdRow{}, false
	for _, r := range runs {
		if !s.met(r) {
			break
		}
		best, ok = r, true
	}
	return best, ok
}

// byFleet splits capacity's rows into runs of one fleet on one network.
func byFleet(rows []pdRow) [][]pdRow {
	var out [][]pdRow
	for i, r := range rows {
		if i == 0 || r.Fleet != rows[i-1].Fleet || r.Decider != rows[i-1].Decider || r.Network != rows[i-1].Network {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], r)
	}
	return out
}

// joinRates lists the rates of the first fleet's runs.
func joinRates(rows []pdRow) string {
	var parts []string
	for _, r := range byFleet(rows)[0] {
		parts = append(parts, fmt.Sprintf("%.3g", r.QPS))
	}
	return strings.Join(parts, ", ")
}

// capacityTable is, per fleet and network, the highest rate meeting the
// SLO and the throughput there, and the same under the TTFT bound alone.
func capacityTable(rows []pdRow, s pdSLO) string {
	var b strings.Builder
	b.WriteString("| fleet | decider | network | max req/s (TTFT and TPOT SLO) | out tok/s there | TTFT p90 / TPOT p90 there | max req/s (TTFT SLO alone) | out tok/s there |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	cell := func(runs []pdRow, s pdSLO) (string, string, pdRow) {
		r, ok := capacityOf(runs, s)
		if !ok {
			return "none", "—", r
		}
		return fmt.Sprintf("%.3g", r.QPS), fmt.Sprintf("%.0f", r.OutTokS), r
	}
	for _, runs := range byFleet(rows) {
		rate, tok, r := cell(runs, s)
		there := "—"
		if rate != "none" {
			there = fmt.Sprintf("%.3fs / %.1fms", r.TTFTP90, r.TPOTP90*1e3)
		}
		ttftRate, ttftTok, _ := cell(runs, pdSLO{s.ttftP90, math.Inf(1)})
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", runs[0].Fleet, runs[0].Decider, runs[0].Network, rate, tok, there, ttftRate, ttftTok)
	}
	return b.String()
}
