package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/director"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/plugins/transfercost"
	"github.com/kvgate/kvgate/extproc/saturation"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/sim/engine"
)

// Defaults for zero Options fields.
const (
	DefaultScrapeInterval = 50 * time.Millisecond
	DefaultKVEventDelay   = 10 * time.Millisecond
	MaxReplicas           = 1024
)

// Options describes the simulated cluster.
type Options struct {
	Replicas int
	Preset   engine.Preset
	// Presets, when not empty, is a preset per replica (len Replicas) and
	// overrides Preset: a fleet of mixed hardware. Every preset must serve
	// the same model, since requests name one.
	Presets []engine.Preset
	// BlockSize and HashSeed configure the engines' KV blocks and block
	// hashes; the precise scorer must use the same values.
	BlockSize int
	HashSeed  string
	// ScrapeInterval is how often each server's metrics are published to
	// the picker; every server is scraped at its own phase.
	ScrapeInterval time.Duration
	// KVEventDelay is how long after the end of an engine step its KV
	// events reach the KV index.
	KVEventDelay time.Duration
	// Seed seeds the picker's randomness and the scrape phases.
	Seed uint64
	// Model is the model name requests carry; default the preset's model.
	Model string
	// SLO, when it has an objective, is sent with a share of the requests.
	SLO SLO
	// Objectives are the InferenceObjectives requests name
	// (workload.Request.Objective), by name: their priorities.
	Objectives map[string]int
	// Job, when set, is a batch job the async processor's gates release
	// into the fleet (AsyncJob).
	Job *AsyncJob
	// SchedulingPolicy is the engines' vLLM --scheduling-policy (default
	// fcfs). Under priority every request carries its objective's
	// priority to its engine, negated: vLLM schedules lower values first,
	// InferenceObjectives rank higher values first.
	SchedulingPolicy engine.SchedulingPolicy
	// Roles, when not empty, is each replica's llm-d.ai/role label (len
	// Replicas; "" for none): a P/D fleet (pd.go).
	Roles []string
	// Network is the network between replicas that P/D requests' KV
	// crosses; nil: the engines' default path. The picker sees it as its
	// transfer-cost decider's NetworkView.
	Network *Network
	// Progress, when set, is called as requests complete.
	Progress func(done, total int)
	Logger   *slog.Logger
	// Scaling, when it has a Scaler, resizes the fleet during the run
	// (scale.go); Replicas is then the starting size and new replicas run
	// the first preset.
	Scaling Scaling
}

// SLO is the latency objective that some requests carry.
type SLO struct {
	// TTFT and TPOT are the objectives, sent in whole milliseconds; zero
	// sends no header for it.
	TTFT, TPOT time.Duration
	// Fraction is the share of requests, chosen by the seed, that carry
	// the objectives; 0 means all of them.
	Fraction float64
}

// Active reports whether the SLO has an objective.
func (o SLO) Active() bool { return o.TTFT > 0 || o.TPOT > 0 }

// carried reports whether request i carries the SLO. The choice depends on
// the seed and the request alone, so that every policy of a comparison
// sees the same requests with objectives.
func (o SLO) carried(seed uint64, i int) bool {
	if !o.Active() {
		return false
	}
	z := rand.NewPCG(seed^0x510c4a7, uint64(i)).Uint64()
	return float64(z>>11)/(1<<53) < o.Fraction
}

// setHeaders adds the objectives to request headers.
func (o SLO) setHeaders(h map[string]string) {
	if o.TTFT > 0 {
		h[eppwire.HeaderSLOTTFT] = strconv.FormatInt(o.TTFT.Milliseconds(), 10)
	}
	if o.TPOT > 0 {
		h[eppwire.HeaderSLOTPOT] = strconv.FormatInt(o.TPOT.Milliseconds(), 10)
	}
}

func (o Options) withDefaults() (Options, error) {
	if o.Replicas < 1 || o.Replicas > MaxReplicas {
		return o, fmt.Errorf("replicas must be 1..%d, got %d", MaxReplicas, o.Replicas)
	}
	if o.BlockSize == 0 {
		o.BlockSize = kvhash.DefaultBlockSize
	}
	if o.HashSeed == "" {
		o.HashSeed = kvhash.DefaultSeed
	}
	if o.ScrapeInterval == 0 {
		o.ScrapeInterval = DefaultScrapeInterval
	}
	if o.KVEventDelay == 0 {
		o.KVEventDelay = DefaultKVEventDelay
	}
	if o.ScrapeInterval < 0 || o.KVEventDelay < 0 {
		return o, errors.New("scrape interval and KV event delay must not be negative")
	}
	switch {
	case len(o.Presets) == 0:
		o.Presets = make([]engine.Preset, o.Replicas)
		for i := range o.Presets {
			o.Presets[i] = o.Preset
		}
	case len(o.Presets) != o.Replicas:
		return o, fmt.Errorf("%d presets for %d replicas", len(o.Presets), o.Replicas)
	}
	for i, p := range o.Presets {
		if m, m0 := p.Model.Name, o.Presets[0].Model.Name; m != m0 {
			return o, fmt.Errorf("replica %d (%s) serves %s, replica 0 (%s) %s: a fleet must serve one model", i, p.Name, m, o.Presets[0].Name, m0)
		}
	}
	if o.Model == "" {
		o.Model = o.Presets[0].Model.Name
	}
	if o.SLO.Fraction == 0 {
		o.SLO.Fraction = 1
	}
	switch slo := o.SLO; {
	case !(slo.Fraction > 0 && slo.Fraction <= 1):
		return o, fmt.Errorf("SLO fraction must be in (0, 1], got %v", slo.Fraction)
	case slo.TTFT < 0 || slo.TPOT < 0 || (slo.TTFT > 0 && slo.TTFT < time.Millisecond) || (slo.TPOT > 0 && slo.TPOT < time.Millisecond):
		return o, fmt.Errorf("SLOs are whole milliseconds, got TTFT %v, TPOT %v", slo.TTFT, slo.TPOT)
	}
	if len(o.Roles) != 0 && len(o.Roles) != o.Replicas {
		return o, fmt.Errorf("%d roles for %d replicas", len(o.Roles), o.Replicas)
	}
	if err := o.Network.validate(o.Replicas); err != nil {
		return o, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Scaling.Scaler != nil {
		// New replicas take the first preset and no role: a P/D fleet
		// or a network between replicas would need them per role.
		if len(o.Roles) > 0 || o.Network != nil || o.Job != nil {
			return o, errors.New("scaling resizes an aggregated fleet: it does not combine with P/D roles, a network or an async job")
		}
		var err error
		if o.Scaling, err = o.Scaling.withDefaults(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// Validate reports options Run would refuse, before any simulation.
func (o Options) Validate() error {
	_, err := o.withDefaults()
	return err
}

// Policy is a picker configuration to evaluate.
type Policy struct {
	Name string
	// Config is an EndpointPickerConfig document; it may use OracleType.
	Config []byte
}

// RequestResult is what happened to one request.
type RequestResult struct {
	Arrival time.Duration
	// TTFT and E2E are measured from arrival; zero when the request failed.
	TTFT, E2E time.Duration
	// TPOT is the mean time per output token after the first; zero for
	// requests with fewer than two.
	TPOT time.Duration
	// PredictedTTFT and PredictedTPOT are the picker's latency predictions
	// for the request on the endpoint it chose; zero when it made none.
	// PredictedTPOTQuantile is the high quantile beside the mean TPOT,
	// which the SLO checks read.
	PredictedTTFT, PredictedTPOT time.Duration
	PredictedTPOTQuantile        time.Duration
	// Joined reports that a request routed to the same replica after this
	// one had arrived when the step that produced this one's first token
	// began, so it may have shared that step's token budget (or, a
	// preempted request, run first): a TTFT no prediction made at the
	// decision can know.
	Joined bool
	// SLO reports that the request carried the SLO headers.
	SLO          bool
	PromptTokens int
	CachedTokens int
	OutputTokens int
	// Replica is the server's index, -1 when the request was not routed;
	// Preset the name of the replica's preset.
	Replica int
	Preset  string
	// Prefill is the replica that prefilled a P/D request, -1 when the
	// request was prefilled where it decoded.
	Prefill    int
	OfferedQPS float64
	// Objective is the InferenceObjective the request named ("" none);
	// Priority its priority.
	Objective string
	Priority  int
	// Queued is the time the request spent in the picker's flow-control
	// queue (zero without flow control).
	Queued time.Duration
	// Outcome is the flow-control outcome of a request that was not
	// served (RejectedCapacity, EvictedTTL, EvictedContextCancelled, …, or
	// Revoked for an in-flight request evicted); "" otherwise.
	Outcome string
	// LeftLate is, for a request that left the queue on its TTL or its
	// client's cancellation, how long after that deadline it left.
	LeftLate time.Duration
	// Err is why the request failed; "" on success.
	Err string
	// Breakdown is where a served request's TTFT went.
	Breakdown TTFTBreakdown
}

// TTFTBreakdown splits a request's TTFT. Queued (RequestResult.Queued) +
// EngineWait + Prefill = TTFT.
type TTFTBreakdown struct {
	// EngineWait is from the engine's receipt to its first scheduling
	// (vLLM's queued time); InFlight is the part of it spent waiting for
	// the step already running when the request arrived, and
	// InFlightInflation the part of that the step's sheddable requests
	// added (all of it for a step of sheddable requests alone).
	EngineWait, InFlight, InFlightInflation time.Duration
	// Prefill is from the first scheduling to the first token: the steps
	// that computed its prompt (and any it waited between chunks).
	Prefill time.Duration
	// DecodeInflation and PrefillInflation are how much longer the steps
	// that computed its prompt were, in total, for the sheddable requests
	// (priority < 0) they also carried: their decodes, then their prefill
	// chunks, priced by the engine's own step model without them.
	DecodeInflation, PrefillInflation time.Duration
	// Preemptions counts the times its engine preempted it.
	Preemptions int
}

// Result is one run of a workload under one policy.
type Result struct {
	Requests []RequestResult
	// MaxQueueImbalance is the largest difference, at any scrape, between
	// the longest and shortest true waiting queue across servers.
	MaxQueueImbalance int
	// Clipped counts prompts cut to fit the model's context.
	Clipped int
	// End is when the last request finished, from the start.
	End time.Duration
	// SLO is the objective requests with RequestResult.SLO carried; zero
	// when none did.
	SLO SLO
	// Learned is what the policy's latency model learned of each preset's
	// replicas by the end of the run; empty for policies without one.
	Learned []LearnedSpeed
	// GPUSeconds is the replicas' GPU time to End: from each one's creation
	// (start-up included) to its removal, or to End.
	GPUSeconds float64
	// Scaling is what a resizing fleet did; empty without a Scaler.
	Scaling ScalingResult
	// Job is the async job's outcome; nil without one.
	Job *JobResult
}

// LearnedSpeed is the latency model's fit of one preset's replicas,
// averaged over them, beside the truth of the preset's timing model.
type LearnedSpeed struct {
	Preset string
	// Replicas is how many of the preset's replicas the model has a fit of.
	Replicas int
	// IdleTTFT is the learned TTFT of a ReferencePrompt-token prompt,
	// nothing cached, on an idle replica; TrueIdleTTFT what the preset's
	// engine takes for it (one step).
	IdleTTFT, TrueIdleTTFT time.Duration
	// LoneTPOT is the learned TPOT of one sequence with a
	// ReferencePrompt-token context decoding alone; TrueLoneTPOT the
	// engine's step for it.
	LoneTPOT, TrueLoneTPOT time.Duration
}

// ReferencePrompt is the prompt length LearnedSpeed compares at: within
// one prefill chunk of every preset.
const ReferencePrompt = 2048

// Run simulates reqs (sorted by arrival) under policy.
func Run(ctx context.Context, opts Options, policy Policy, reqs []workload.Request) (*Result, error) {
	s, err := newSim(opts, policy, reqs)
	if err != nil {
		return nil, err
	}
	return s.run(ctx)
}

// replica is one simulated server. The simulation goroutine owns it.
type replica struct {
	idx    int
	preset string
	eng    *engine.Engine
	ep     *endpoints.Endpoint // nil until it first serves
	addr   string
	spec   endpoints.Spec
	life   lifecycle

	busy    bool
	stepEnd time.Time
	// routed counts the requests handed to the replica; stepRouted is
	// that count when the step in flight began.
	routed, stepRouted int
	// protectedEnd is when the step in flight would have ended without its
	// sheddable requests (its start when it had nothing else).
	protectedEnd time.Time
	// What the step in flight produces when it ends, copied out of the
	// engine's reused StepResult.
	firsts []string
	// nexts are the streams that produced a later token in the step.
	nexts    []string
	finished []engine.Finished
	events   []engine.Event

	nextScrape time.Time
	// cache mirrors the engine's prefix cache exactly (every event applied
	// at once) for the oracle: the truth the real picker only sees late.
	// It counts each hash's blocks: the engine, as vLLM's block pool, can
	// hold two blocks of one hash and removes each with its own event.
	cache map[uint64]int
	// backlog is the uncached prompt tokens of requests routed here that
	// have not produced their first token, as the oracle estimated them,
	// and pending counts those requests' blocks: the engine will compute
	// them before any request routed here later, so they are as good as
	// cached for it.
	backlog int
	pending map[uint64]int
}

type liveReq struct {
	idx     int
	ex      server.Exchange
	rep     *replica
	arrival time.Time
	first   time.Time
	oracle  oracleChoice
	// order is the replica's routed count when this request was routed.
	order int
	// received is when its engine got it; bd accumulates its TTFT
	// breakdown's step parts.
	received time.Time
	bd       TTFTBreakdown
}

type kvDelivery struct {
	due    time.Time
	rep    *replica
	events []engine.Event
}

type sim struct {
	opts   Options
	reqs   []workload.Request
	clock  *engine.VirtualClock
	start  time.Time
	reps   []*replica
	byAddr map[string]*replica
	dir    *director.Director
	// model is the policy's latency model, when it has one.
	model *latency.Model
	// holds are the requests a Holder keeps in the picker.
	holds  holds
	index  *kvindex.Index
	hasher *kvhash.Hasher
	maxLen int

	kvq     []kvDelivery // FIFO: due times are non-decreasing
	live    map[string]*liveReq
	oracled map[string]oracleChoice // request id → the oracle's view of its choice
	res     Result
	done    int
	// flow is the policy's flow-control layer; nil without the gate.
	flow *simFlow
	ds   *endpoints.Datastore
	// scale resizes the fleet; nil without a Scaler.
	scale *scaling
	// online counts the requests that arrive on their own (s.reqs before
	// the async job's); job is the job, nil without one.
	online int
	job    *simJob
	pd     pdState
}

// start is an arbitrary fixed epoch: results must not depend on the wall
// clock.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func newSim(opts Options, policy Policy, reqs []workload.Request) (*sim, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	for i := 1; i < len(reqs); i++ {
		if reqs[i].Arrival < reqs[i-1].Arrival {
			return nil, fmt.Errorf("requests must be sorted by arrival: request %d arrives before request %d", i, i-1)
		}
	}
	h, err := kvhash.New(opts.HashSeed, opts.BlockSize)
	if err != nil {
		return nil, err
	}
	s := &sim{
		opts: opts, reqs: reqs, clock: engine.NewVirtualClock(epoch), start: epoch,
		byAddr: make(map[string]*replica, opts.Replicas),
		index:  kvindex.New(kvindex.Config{}),
		hasher: h,
		live:   make(map[string]*liveReq),
	}
	s.res.Requests = make([]RequestResult, len(reqs))
	if opts.SLO.Active() {
		s.res.SLO = opts.SLO
	}
	rng := rand.New(rand.NewPCG(opts.Seed, 0x9a7e))
	specs := make([]endpoints.Spec, opts.Replicas)
	for i := range opts.Replicas {
		r, err := s.newReplica(i, opts.Presets[i])
		if err != nil {
			return nil, err
		}
		// Prompts are clipped before routing, so they must fit every
		// replica: presets of one model can still differ in KV capacity.
		if ml := r.eng.Config().MaxModelLen; i == 0 || ml < s.maxLen {
			s.maxLen = ml
		}
		r.life = lifecycle{created: epoch, readyAt: epoch, ready: true}
		specs[i] = r.spec
		if len(opts.Roles) > 0 {
			specs[i].Labels = roleLabels(opts.Roles[i])
			r.spec = specs[i]
		}
		s.reps = append(s.reps, r)
		s.byAddr[r.addr] = r
	}
	ds := endpoints.NewDatastore()
	if err := ds.Replace(specs); err != nil {
		return nil, err
	}
	s.ds = ds
	for _, r := range s.reps {
		r.ep = ds.ByAddress(r.addr)
		s.scrape(r)
		// Each server is scraped by its own loop, at its own phase.
		r.nextScrape = epoch.Add(time.Duration(rng.Int64N(int64(opts.ScrapeInterval)) + 1))
	}

	cfg, err := config.Parse(policy.Config)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", policy.Name, err)
	}
	reg := all.Registry()
	if err := reg.Register(OracleType, s.newOracle); err != nil {
		return nil, err
	}
	handle := &scheduling.Handle{
		Log:      opts.Logger,
		Now:      s.clock.Now,
		Rand:     rand.New(rand.NewPCG(opts.Seed, 0x91c4)), // used by this goroutine only
		Services: precise.WithKVIndex(nil, s.index),
	}
	latency.WithRecorder(handle.Services, predictions{s})
	if opts.Network != nil {
		handle.Services[transfercost.ServiceNetworkView] = transfercost.NetworkView(networkView{s})
	}
	built, err := config.Build(cfg, reg, handle, nil)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", policy.Name, err)
	}
	for _, p := range built.Plugins {
		if m, ok := p.(interface{ Model() *latency.Model }); ok {
			s.model = m.Model()
		}
	}
	dopts := director.Options{
		Pool:       ds,
		Scheduler:  built.Scheduler,
		Hooks:      director.Hooks{RequestHeader: built.RequestHeader, PreRequest: built.PreRequest, FirstToken: built.FirstToken, ResponseComplete: built.ResponseComplete, Hold: built.Hold},
		Saturation: saturation.New(built.Saturation, s.clock.Now),
		Objectives: objectives(opts.Objectives),
		Now:        s.clock.Now,
		Logger:     opts.Logger,
		// Holds wait on the virtual clock (hold.go).
		DriverHolds: true,
	}
	if sd, ok := built.Detector.(director.Saturation); ok {
		dopts.Saturation = sd
	}
	if built.FlowControl != nil {
		if s.flow, err = newSimFlow(s, built.FlowControl.Config, ds); err != nil {
			return nil, fmt.Errorf("policy %s: %w", policy.Name, err)
		}
		dopts.Admission = s.flow
	}
	s.dir = director.New(dopts)
	if opts.Scaling.Scaler != nil {
		s.scale = &scaling{cfg: opts.Scaling, next: epoch, nextIdx: opts.Replicas,
			detector: saturation.New(built.Saturation, s.clock.Now)}
		s.record(epoch)
	}
	s.online = len(reqs)
	if opts.Job != nil {
		// The job's gate reads the picker's pool saturation directly.
		sat := saturation.New(built.Saturation, s.clock.Now).Pool
		switch {
		case built.FlowControl != nil:
			sat = built.FlowControl.Config.Detector.Saturation
		case built.Detector != nil:
			sat = built.Detector.Saturation
		}
		if s.job, err = newSimJob(s, *opts.Job, ds, sat); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// newReplica creates replica i's engine; the caller sets its lifecycle.
func (s *sim) newReplica(i int, p engine.Preset) (*replica, error) {
	eng, err := engine.New(engine.Config{
		Timing: p.Timing, Clock: s.clock, BlockSize: s.opts.BlockSize, HashSeed: s.opts.HashSeed,
		SchedulingPolicy: s.opts.SchedulingPolicy,
		// vLLM's waiting queue is unbounded; the engine's bound only
		// has to exceed any queue the workload can build.
		MaxWaiting: max(1024, len(s.reqs)),
	})
	if err != nil {
		return nil, fmt.Errorf("replica %d: %w", i, err)
	}
	r := &replica{
		idx: i, preset: p.Name, eng: eng, addr: fmt.Sprintf("10.%d.%d.%d:8000", i/62500, i/250%250, i%250+1),
		nextScrape: s.clock.Now(),
		cache:      make(map[uint64]int),
		pending:    make(map[uint64]int),
	}
	r.spec = endpoints.Spec{Name: fmt.Sprintf("replica-%03d", i), Address: r.addr}
	return r, nil
}

// learned averages the latency model's per-replica fits by preset.
func (s *sim) learned() []LearnedSpeed {
	if s.model == nil {
		return nil
	}
	by := map[string]*LearnedSpeed{}
	var order []string
	fits := s.model.Fits()
	// In address order: the sums must not depend on map order, so that a
	// seed reproduces its results exactly.
	slices.SortFunc(fits, func(a, b latency.Fit) int { return strings.Compare(a.Address, b.Address) })
	for _, f := range fits {
		r := s.byAddr[f.Address]
		// Below the minimum the model predicts with the pool's fit, not
		// this replica's: that is not what it learned of the preset.
		if r == nil || f.TTFTSamples < latency.DefaultMinSamples || f.TPOTSamples < latency.DefaultMinSamples {
			continue
		}
		name := r.preset
		if name == "" {
			name = s.opts.Preset.Name
		}
		l := by[name]
		if l == nil {
			n := ReferencePrompt
			timing := r.eng.Config().Timing
			l = &LearnedSpeed{Preset: name,
				TrueIdleTTFT: timing.StepDuration(engine.Shape{PrefillTokens: n, SampledSeqs: 1, ContextTokens: n, AttentionPairs: float64(n) * float64(n+1) / 2}),
				TrueLoneTPOT: timing.StepDuration(engine.Shape{DecodeSeqs: 1, SampledSeqs: 1, ContextTokens: n + 1, AttentionPairs: float64(n + 1)}),
			}
			by[name] = l
			order = append(order, name)
		}
		l.Replicas++
		// An idle replica (the run is over: nothing is queued), so the
		// engine twin predicts where it has learned the replica's steps.
		idle := latency.Features{Prefill: ReferencePrompt, Attention: float64(endpoints.AttentionPairs(0, ReferencePrompt))}
		l.IdleTTFT += s.model.PredictLive(f.Address, &idle, s.clock.Now(), latency.Engine{}).TTFT
		l.LoneTPOT += s.model.Predict(f.Address, latency.Features{Decodes: 1, DecodeTokens: ReferencePrompt}).TPOT
	}
	slices.Sort(order)
	out := make([]LearnedSpeed, 0, len(order))
	for _, name := range order {
		l := by[name]
		l.IdleTTFT /= time.Duration(l.Replicas)
		l.LoneTPOT /= time.Duration(l.Replicas)
		out = append(out, *l)
	}
	return out
}

// predictions records the picker's latency predictions into the results of
// the requests they were made for, so the report can score the predictor.
type predictions struct{ s *sim }

func (p predictions) result(id string) *RequestResult {
	i, err := strconv.Atoi(strings.TrimPrefix(id, requestIDPrefix))
	if err != nil || i < 0 || i >= len(p.s.res.Requests) {
		return nil
	}
	return &p.s.res.Requests[i]
}

// Predicted implements latency.Recorder.
func (p predictions) Predicted(id, _ string, e latency.Estimate) {
	if rr := p.result(id); rr != nil {
		rr.PredictedTTFT, rr.PredictedTPOT, rr.PredictedTPOTQuantile = e.TTFT, e.TPOT, e.TPOTQuantile
	}
	if sc := p.s.scale; sc != nil {
		sc.predicted = append(sc.predicted, Prediction{TTFT: e.TTFT, TPOT: e.TPOT})
	}
}

// ObservedTTFT implements latency.Recorder; the report compares itself.
func (predictions) ObservedTTFT(string, string, time.Duration, time.Duration) {}

// ObservedTPOT implements latency.Recorder.
func (predictions) ObservedTPOT(string, string, time.Duration, time.Duration) {}

// requestIDPrefix starts every simulated request's id.
const requestIDPrefix = "r"

// ErrStuck reports a simulation in which requests remain but nothing can
// make progress; it indicates a bug, not a workload property.
var ErrStuck = errors.New("simulation stuck")

func (s *sim) run(ctx context.Context) (*Result, error) {
	total := len(s.reqs)
	next, reported := 0, 0
	for s.done < total {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t, ok := s.nextEvent(next)
		if !ok {
			return nil, fmt.Errorf("%w with %d of %d requests done", ErrStuck, s.done, total)
		}
		s.clock.Set(t)
		// At equal times: outputs first, then what the picker learns, then
		// new requests, then new steps, so that a step sees every request
		// that arrived by its start.
		for _, r := range s.reps {
			if r.busy && !r.stepEnd.After(t) {
				s.complete(ctx, r, t)
			}
		}
		for len(s.kvq) > 0 && !s.kvq[0].due.After(t) {
			s.deliver(s.kvq[0])
			s.kvq[0] = kvDelivery{}
			s.kvq = s.kvq[1:]
		}
		for _, r := range s.reps {
			if !r.nextScrape.After(t) {
				s.scrape(r)
				for !r.nextScrape.After(t) {
					r.nextScrape = r.nextScrape.Add(s.opts.ScrapeInterval)
				}
			}
		}
		if err := s.settle(t); err != nil {
			return nil, err
		}
		if err := s.resize(t); err != nil {
			return nil, err
		}
		s.flow.cancel(t)
		for next < s.online && !s.start.Add(s.reqs[next].Arrival).After(t) {
			s.arrive(ctx, next, t)
			next++
		}
		s.job.poll(ctx, t)
		s.flow.dispatch(ctx, t)
		s.holds.releaseDue(t)
		s.arriveHeld(ctx, t)
		for _, r := range s.reps {
			if !r.busy {
				s.step(r, t)
			}
		}
		if s.opts.Progress != nil && (s.done >= reported+64 || s.done == total) {
			reported = s.done
			s.opts.Progress(s.done, total)
		}
	}
	for _, r := range s.reps {
		s.res.End = max(s.res.End, r.stepEnd.Sub(s.start))
	}
	for _, r := range s.reps {
		s.res.GPUSeconds += r.gpuSeconds(s.start.Add(s.res.End))
	}
	s.res.Learned = s.learned()
	if s.job != nil {
		r := s.job.res
		s.res.Job = &r
	}
	return &s.res, nil
}

// nextEvent is the earliest pending event time. Scrapes alone do not count
// as progress: with no arrival, step, delivery or wake-up pending, the
// simulation cannot finish.
func (s *sim) nextEvent(next int) (time.Time, bool) {
	var t time.Time
	ok := false
	take := func(c time.Time) {
		if !ok || c.Before(t) {
			t, ok = c, true
		}
	}
	if next < s.online {
		take(s.start.Add(s.reqs[next].Arrival))
	}
	for _, r := range s.reps {
		if r.busy {
			take(r.stepEnd)
		} else if w, wok := r.eng.NextWake(); wok {
			take(w)
		}
	}
	if len(s.kvq) > 0 {
		take(s.kvq[0].due)
	}
	s.holds.nextEvent(take)
	if ft, fok := s.flow.nextEvent(); fok {
		take(ft)
	}
	jt, jprogress, jok := s.job.nextEvent()
	if jok && jprogress {
		take(jt)
	}
	if !ok {
		return t, false
	}
	if jok {
		take(jt)
	}
	for _, r := range s.reps {
		take(r.nextScrape)
	}
	s.nextScaleEvent(take)
	return t, true
}

// scrape publishes the server's metrics to the picker, as the metrics
// scraper does in production.
func (s *sim) scrape(r *replica) {
	if r.ep == nil {
		return // not serving yet
	}
	m := r.eng.Metrics()
	r.ep.SetMetrics(&endpoints.Metrics{
		WaitingQueueSize: m.Waiting,
		RunningRequests:  m.Running,
		KVCacheUsage:     m.KVUsage,
		BlockSize:        m.BlockSize,
		NumGPUBlocks:     m.NumGPUBlocks,
		UpdateTime:       s.clock.Now(),
	})
	if r.idx != 0 {
		return
	}
	// Once per scrape interval, the truth behind the snapshots.
	lo, hi := m.Waiting, m.Waiting
	for _, o := range s.reps[1:] {
		if !o.life.ready || o.life.draining {
			continue
		}
		w := o.eng.Metrics().Waiting
		lo, hi = min(lo, w), max(hi, w)
	}
	s.res.MaxQueueImbalance = max(s.res.MaxQueueImbalance, hi-lo)
}

// arrive routes request i through the director and hands it to the chosen
// engine.
func (s *sim) arrive(ctx context.Context, i int, now time.Time) {
	w := &s.reqs[i]
	rr := &s.res.Requests[i]
	rr.Arrival, rr.OfferedQPS, rr.Replica, rr.Prefill = w.Arrival, w.OfferedQPS, -1, -1
	out := min(w.OutputTokens, s.maxLen-1)
	prompt := w.Prompt(s.maxLen - out)
	if len(prompt) < w.PromptLen() {
		s.res.Clipped++
	}
	rr.PromptTokens = len(prompt)
	id := requestIDPrefix + strconv.Itoa(i)
	req := &server.Request{
		ID: id, Method: "POST", Path: "/v1/completions", API: openai.Completions,
		Headers: map[string]string{"content-type": "application/json", eppwire.HeaderRequestID: id},
		Parsed: &openai.Request{
			API: openai.Completions, Model: s.opts.Model, Stream: true, IncludeUsage: true,
			PromptTokenIDs: prompt, MaxTokens: out,
		},
		FairnessID: server.DefaultFairnessID,
		ReceivedAt: now,
	}
	if s.opts.SLO.carried(s.opts.Seed, i) {
		rr.SLO = true
		s.opts.SLO.setHeaders(req.Headers)
	}
	if w.Objective != "" {
		req.Objective = w.Objective
		req.Headers[eppwire.HeaderObjective] = w.Objective
		rr.Objective = w.Objective
		rr.Priority = s.opts.Objectives[w.Objective]
	}
	if s.flow != nil {
		s.flow.enqueue(i, req, prompt, now)
		return
	}
	dec, ex, err := s.dir.HandleRequest(ctx, req)
	s.begin(ctx, i, req, prompt, dec, ex, err, now)
}

// begin hands a routed request to the chosen engine, unless the picker
// holds it (hold.go); err is the picker's refusal.
func (s *sim) begin(ctx context.Context, i int, req *server.Request, prompt []int, dec *server.Decision, ex server.Exchange, err error, now time.Time) {
	if err != nil {
		s.fail(&s.res.Requests[i], fmt.Errorf("picker: %w", err))
		return
	}
	if s.holds.hold(i, req, prompt, dec, ex, now) {
		return
	}
	s.handOver(ctx, i, req, prompt, dec, ex, now)
}

// handOver hands a routed request that the picker let go to its engine.
func (s *sim) handOver(ctx context.Context, i int, req *server.Request, prompt []int, dec *server.Decision, ex server.Exchange, now time.Time) {
	rr := &s.res.Requests[i]
	id := req.ID
	out := req.Parsed.MaxTokens
	r := s.byAddr[dec.Endpoints[0]]
	if r == nil {
		s.fail(rr, fmt.Errorf("picker chose unknown endpoint %q", dec.Endpoints[0]))
		return
	}
	if s.beginPD(ctx, i, req, prompt, r, dec, ex) {
		return
	}
	rr.Replica, rr.Preset = r.idx, r.preset
	if err := r.eng.Add(engine.Request{ID: id, Prompt: prompt, MaxTokens: out, Priority: -rr.Priority}); err != nil {
		ex.ResponseDone(ctx, server.ResponseSummary{Status: 503, ServedEndpoint: r.addr})
		delete(s.oracled, id)
		s.fail(rr, fmt.Errorf("engine: %w", err))
		return
	}
	// The engine holds its own copy; the picker is done with the body.
	req.Parsed.PromptTokenIDs = nil
	r.routed++
	lr := &liveReq{idx: i, ex: ex, rep: r, arrival: s.start.Add(s.reqs[i].Arrival), received: now, order: r.routed}
	if r.busy {
		lr.bd.InFlight = r.stepEnd.Sub(now)
		lr.bd.InFlightInflation = lr.bd.InFlight - max(0, r.protectedEnd.Sub(now))
	}
	if c, ok := s.oracled[id]; ok {
		lr.oracle = c
		r.backlog += c.uncached
		for _, h := range c.hashes {
			r.pending[h]++
		}
		delete(s.oracled, id)
	}
	s.live[id] = lr
}

func (s *sim) fail(rr *RequestResult, err error) {
	rr.Err = err.Error()
	if i := s.job.owns(rr); i >= 0 && s.job.failed(i, rr, s.clock.Now()) {
		return // retried
	}
	s.done++
}

// step starts the replica's next engine step, if it has work.
func (s *sim) step(r *replica, now time.Time) {
	res := r.eng.Step()
	if res.Idle() {
		return
	}
	r.busy = true
	r.stepEnd = now.Add(res.Duration)
	r.stepRouted = r.routed
	r.life.busy += res.Duration
	r.firsts, r.nexts = r.firsts[:0], r.nexts[:0]
	for _, t := range res.Tokens {
		if t.Index == 0 {
			r.firsts = append(r.firsts, t.ID)
		} else {
			r.nexts = append(r.nexts, t.ID)
		}
	}
	r.finished = append(r.finished[:0], res.Finished...)
	r.events = append(r.events[:0], res.Events...)
	r.protectedEnd = now.Add(s.attribute(r.eng.Config().Timing, res))
	// The engine's cache changed when Step ran: the oracle sees it now.
	// Only the oracle reads the mirror, so other policies skip its cost.
	if s.oracled != nil {
		applyEvents(r.cache, r.events)
	}
}

// attribute charges a step's length, and what the sheddable requests in it
// added to it, to the requests whose prompts it computed. It returns the
// step's length without its sheddable requests.
func (s *sim) attribute(t engine.Timing, res *engine.StepResult) time.Duration {
	var mine, noDecodes engine.Shape
	prefilling := false
	for _, q := range res.Scheduled {
		lr := s.live[q.ID]
		shed := lr != nil && s.res.Requests[lr.idx].Priority < 0
		if !shed || !q.Decode {
			q.Add(&noDecodes)
		}
		if !shed {
			q.Add(&mine)
		}
		prefilling = prefilling || (lr != nil && lr.first.IsZero() && !shed)
	}
	dMine := t.StepDuration(mine)
	if !prefilling {
		return dMine
	}
	dNo := t.StepDuration(noDecodes)
	for _, q := range res.Scheduled {
		lr := s.live[q.ID]
		if lr == nil || !lr.first.IsZero() || s.res.Requests[lr.idx].Priority < 0 {
			continue
		}
		lr.bd.DecodeInflation += res.Duration - dNo
		lr.bd.PrefillInflation += dNo - dMine
	}
	return dMine
}

// complete acts on the outputs of the replica's step that ended at now.
func (s *sim) complete(ctx context.Context, r *replica, now time.Time) {
	r.busy = false
	chunk := []byte("data: {}\n\n")
	for _, id := range r.firsts {
		if s.prefilled(ctx, id) {
			continue
		}
		lr := s.live[id]
		if lr == nil {
			continue
		}
		s.pulled(id)
		lr.first = now
		s.res.Requests[lr.idx].Joined = r.stepRouted > lr.order
		r.backlog -= lr.oracle.uncached
		for _, h := range lr.oracle.hashes {
			if r.pending[h]--; r.pending[h] <= 0 {
				delete(r.pending, h)
			}
		}
		lr.oracle = oracleChoice{}
		// A streamed response's headers come with its first token.
		lr.ex.ResponseStarted(ctx, server.ResponseHead{Status: 200, ServedEndpoint: r.addr})
		lr.ex.ResponseChunk(ctx, chunk)
	}
	// Every later token is a chunk of its stream, as a streaming server
	// sends them: the picker sees the step ends (and measures TPOT from
	// the first chunk to the last).
	for _, id := range r.nexts {
		if lr := s.live[id]; lr != nil {
			lr.ex.ResponseChunk(ctx, chunk)
		}
	}
	for _, f := range r.finished {
		lr := s.live[f.ID]
		if lr == nil {
			continue
		}
		delete(s.live, f.ID)
		lr.ex.ResponseDone(ctx, server.ResponseSummary{
			Status: 200, UsageFound: true, Streaming: true, Complete: true, ServedEndpoint: r.addr,
			Usage: openai.Usage{PromptTokens: f.Usage.PromptTokens, CompletionTokens: f.Usage.CompletionTokens, CachedTokens: f.Usage.CachedTokens},
		})
		rr := &s.res.Requests[lr.idx]
		lr.bd.EngineWait = f.Scheduled.Sub(lr.received)
		lr.bd.InFlight = min(lr.bd.InFlight, lr.bd.EngineWait)
		lr.bd.InFlightInflation = min(lr.bd.InFlightInflation, lr.bd.InFlight)
		lr.bd.Prefill = lr.first.Sub(f.Scheduled)
		lr.bd.Preemptions = f.Preemptions
		rr.Breakdown = lr.bd
		rr.TTFT = lr.first.Sub(lr.arrival)
		rr.E2E = now.Sub(lr.arrival)
		rr.CachedTokens = f.Usage.CachedTokens
		rr.OutputTokens = f.Usage.CompletionTokens
		if rr.OutputTokens > 1 {
			rr.TPOT = (rr.E2E - rr.TTFT) / time.Duration(rr.OutputTokens-1)
		}
		if s.scale != nil {
			s.scale.finished = append(s.scale.finished, *rr)
		}
		s.done++
		s.job.finished(lr.idx, now)
	}
	if len(r.events) > 0 {
		// vLLM publishes a step's events when the step ends; they reach
		// the index after the transport's delay. Completions happen in
		// time order, so the queue stays sorted by due time.
		s.kvq = append(s.kvq, kvDelivery{due: now.Add(s.opts.KVEventDelay), rep: r, events: r.events})
		r.events = nil
	}
}

// deliver applies KV events to the index, as the KV-event subscriber does.
func (s *sim) deliver(d kvDelivery) {
	if d.rep.life.draining {
		return // out of the pool: its index entries are gone
	}
	for _, ev := range d.events {
		switch e := ev.(type) {
		case *engine.BlockStored:
			if err := s.index.Add(d.rep.addr, kvindex.TierFromMedium(e.Medium), e.BlockHashes); err != nil {
				s.opts.Logger.Warn("kv index add", "endpoint", d.rep.addr, "err", err)
			}
		case *engine.BlockRemoved:
			s.index.Remove(d.rep.addr, kvindex.TierFromMedium(e.Medium), e.BlockHashes)
		case *engine.AllBlocksCleared:
			s.index.ClearEndpoint(d.rep.addr)
		}
	}
}

// applyEvents applies a step's KV events to a replica's mirror of its
// prefix cache.
func applyEvents(cache map[uint64]int, events []engine.Event) {
	for _, ev := range events {
		switch e := ev.(type) {
		case *engine.BlockStored:
			for _, h := range e.BlockHashes {
				cache[h]++
			}
		case *engine.BlockRemoved:
			for _, h := range e.BlockHashes {
				if cache[h]--; cache[h] <= 0 {
					delete(cache, h)
				}
			}
		case *engine.AllBlocksCleared:
			clear(cache)
		}
	}
}
