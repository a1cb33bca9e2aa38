package flowpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/saturation"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/duration"
)

// Utilization is utilization-detector, the default: an endpoint's score is
// max(queue / queueDepthThreshold, kv / kvCacheUtilThreshold), the pool's
// saturation the unweighted mean of its endpoints' scores, and an endpoint
// whose metrics are missing or older than metricsStalenessThreshold scores
// 1.0 (fail closed). The queue is the live load model's: the requests the
// picker routed there that have not produced a first token plus the
// server's own waiting requests the picker did not route (as of the last
// scrape), so a dispatch counts at once instead of at the next scrape; the
// KV use is the last scrape's. As a scheduling filter it removes
// endpoints that are stale or above threshold·(1+headroom) (KV capped at
// 1.0), keeping all of them when it would remove every one.
//
// Parameters:
//
//	queueDepthThreshold: int  waiting requests per server at saturation 1, > 0 (default 5)
//	kvCacheUtilThreshold: float  KV-cache use at saturation 1, in (0, 1] (default 0.8)
//	metricsStalenessThreshold: duration  age beyond which metrics count as saturated (default "200ms")
//	headroom: float  burst allowed above the thresholds by the filter, >= 0 (default 0.0)
type Utilization struct {
	scheduling.Named
	cfg      saturation.Config
	headroom float64
	now      func() time.Time
}

// UtilizationParams are utilization-detector's parameters.
type UtilizationParams struct {
	QueueDepthThreshold       *int               `json:"queueDepthThreshold"`
	KVCacheUtilThreshold      *float64           `json:"kvCacheUtilThreshold"`
	MetricsStalenessThreshold *duration.Duration `json:"metricsStalenessThreshold"`
	Headroom                  *float64           `json:"headroom"`
}

// NewUtilization is the plugin factory.
func NewUtilization(name string, params json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p UtilizationParams
	if err := scheduling.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	cfg := saturation.Defaults()
	if p.QueueDepthThreshold != nil {
		cfg.QueueDepthThreshold = *p.QueueDepthThreshold
	}
	if p.KVCacheUtilThreshold != nil {
		cfg.KVCacheUtilThreshold = *p.KVCacheUtilThreshold
	}
	if p.MetricsStalenessThreshold != nil {
		cfg.MetricsStalenessThreshold = *p.MetricsStalenessThreshold
	}
	u := &Utilization{Named: scheduling.NewNamed(UtilizationType, name), cfg: cfg, now: scheduling.NowOf(h)}
	if p.Headroom != nil {
		u.headroom = *p.Headroom
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	if !(u.headroom >= 0) {
		return nil, fmt.Errorf("parameters.headroom must be >= 0, got %v", u.headroom)
	}
	return u, nil
}

// NewUtilizationFrom is a utilization detector with the thresholds of a
// legacy top-level saturationDetector section.
func NewUtilizationFrom(name string, cfg saturation.Config, now func() time.Time) *Utilization {
	return &Utilization{Named: scheduling.NewNamed(UtilizationType, name), cfg: cfg, now: now}
}

func (u *Utilization) stale(e *endpoints.Endpoint, now time.Time) bool {
	return e.MetricsAge(now) > time.Duration(u.cfg.MetricsStalenessThreshold)
}

func liveQueue(e *endpoints.Endpoint) float64 {
	l := e.Load()
	return float64(l.PrefillRequests + l.ExternalWaiting)
}

func (u *Utilization) score(e *endpoints.Endpoint, now time.Time) float64 {
	if u.stale(e, now) {
		return 1
	}
	return max(liveQueue(e)/float64(u.cfg.QueueDepthThreshold), e.Metrics().KVCacheUsage/u.cfg.KVCacheUtilThreshold)
}

// Saturation implements flowcontrol.SaturationDetector; an empty pool is
// saturated.
func (u *Utilization) Saturation(eps []*endpoints.Endpoint) float64 {
	if len(eps) == 0 {
		return 1
	}
	now := u.now()
	sum := 0.0
	for _, e := range eps {
		sum += u.score(e, now)
	}
	return sum / float64(len(eps))
}

// Saturated reports a saturated pool (the director sheds sheddable
// requests without flow control).
func (u *Utilization) Saturated(eps []*endpoints.Endpoint) bool { return u.Saturation(eps) >= 1 }

// StaleEndpoints implements flowcontrol.StaleCounter.
func (u *Utilization) StaleEndpoints(eps []*endpoints.Endpoint) int {
	now := u.now()
	n := 0
	for _, e := range eps {
		if u.stale(e, now) {
			n++
		}
	}
	return n
}

// Credit implements flowcontrol.ReclaimCredit: one request less waiting on
// one of n servers.
func (u *Utilization) Credit(eps []*endpoints.Endpoint) float64 {
	return 1 / float64(max(1, len(eps))*u.cfg.QueueDepthThreshold)
}

// Filter implements scheduling.Filter.
func (u *Utilization) Filter(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	now := u.now()
	maxQ := float64(u.cfg.QueueDepthThreshold) * (1 + u.headroom)
	maxKV := min(1, u.cfg.KVCacheUtilThreshold*(1+u.headroom))
	keep := func(e *endpoints.Endpoint) bool {
		return !u.stale(e, now) && liveQueue(e) <= maxQ && e.Metrics().KVCacheUsage <= maxKV
	}
	return filterFailOpen(eps, keep)
}

// filterFailOpen keeps the endpoints keep accepts, or all of them when it
// accepts none.
func filterFailOpen(eps []*endpoints.Endpoint, keep func(*endpoints.Endpoint) bool) []*endpoints.Endpoint {
	n := 0
	for _, e := range eps {
		if keep(e) {
			n++
		}
	}
	if n == 0 || n == len(eps) {
		return eps
	}
	kept := eps[:0]
	for _, e := range eps {
		if keep(e) {
			kept = append(kept, e)
		}
	}
	return kept
}

// Concurrency modes.
const (
	ModeRequests = "requests"
	ModeTokens   = "tokens"
	ModeHybrid   = "hybrid"
)

// Concurrency is concurrency-detector: saturation from the picker's own
// in-flight accounting (a request counts from its dispatch to the end of
// its response). In requests mode the pool's saturation is its in-flight
// requests over n·maxConcurrency, in tokens mode its in-flight tokens over
// n·maxTokenConcurrency, in hybrid mode the mean over endpoints of the
// larger of the two ratios. As a scheduling filter it removes endpoints
// whose in-flight load reaches capacity·(1+headroom), keeping all of them
// when it would remove every one.
//
// Parameters:
//
//	concurrencyMode: string  requests, tokens or hybrid (default requests)
//	maxConcurrency: int  in-flight requests per server at saturation 1, > 0 (default 100)
//	maxTokenConcurrency: int  in-flight tokens per server at saturation 1, > 0 (default 1000000)
//	headroom: float  burst allowed above capacity by the filter, >= 0 (default 0.0)
type Concurrency struct {
	scheduling.Named
	mode             string
	maxReqs, maxToks float64
	headroom         float64
}

// ConcurrencyParams are concurrency-detector's parameters.
type ConcurrencyParams struct {
	ConcurrencyMode     string   `json:"concurrencyMode"`
	MaxConcurrency      *int64   `json:"maxConcurrency"`
	MaxTokenConcurrency *int64   `json:"maxTokenConcurrency"`
	Headroom            *float64 `json:"headroom"`
}

// NewConcurrency is the plugin factory.
func NewConcurrency(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p ConcurrencyParams
	if err := scheduling.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	c := &Concurrency{Named: scheduling.NewNamed(ConcurrencyType, name), mode: ModeRequests, maxReqs: 100, maxToks: 1_000_000}
	switch p.ConcurrencyMode {
	case "":
	case ModeRequests, ModeTokens, ModeHybrid:
		c.mode = p.ConcurrencyMode
	default:
		return nil, fmt.Errorf("parameters.concurrencyMode must be requests, tokens or hybrid, got %q", p.ConcurrencyMode)
	}
	if p.MaxConcurrency != nil {
		if *p.MaxConcurrency <= 0 {
			return nil, fmt.Errorf("parameters.maxConcurrency must be > 0, got %d", *p.MaxConcurrency)
		}
		c.maxReqs = float64(*p.MaxConcurrency)
	}
	if p.MaxTokenConcurrency != nil {
		if *p.MaxTokenConcurrency <= 0 {
			return nil, fmt.Errorf("parameters.maxTokenConcurrency must be > 0, got %d", *p.MaxTokenConcurrency)
		}
		c.maxToks = float64(*p.MaxTokenConcurrency)
	}
	if p.Headroom != nil {
		if !(*p.Headroom >= 0) {
			return nil, fmt.Errorf("parameters.headroom must be >= 0, got %v", *p.Headroom)
		}
		c.headroom = *p.Headroom
	}
	return c, nil
}

// Saturation implements flowcontrol.SaturationDetector; an empty pool is
// saturated.
func (c *Concurrency) Saturation(eps []*endpoints.Endpoint) float64 {
	if len(eps) == 0 {
		return 1
	}
	n := float64(len(eps))
	var reqs, toks, hybrid float64
	for _, e := range eps {
		r, t := float64(e.InflightRequests()), float64(e.InflightTokens())
		reqs += r
		toks += t
		hybrid += max(r/c.maxReqs, t/c.maxToks)
	}
	switch c.mode {
	case ModeTokens:
		return toks / (n * c.maxToks)
	case ModeHybrid:
		return hybrid / n
	default:
		return reqs / (n * c.maxReqs)
	}
}

// Saturated reports a saturated pool.
func (c *Concurrency) Saturated(eps []*endpoints.Endpoint) bool { return c.Saturation(eps) >= 1 }

// Credit implements flowcontrol.ReclaimCredit: one request's share of the
// pool's capacity (in tokens mode, a request of the pool's mean size).
func (c *Concurrency) Credit(eps []*endpoints.Endpoint) float64 {
	n := float64(max(1, len(eps)))
	if c.mode == ModeTokens {
		if reqs, toks := inflight(eps, allInflight); reqs > 0 {
			return toks / reqs / (n * c.maxToks)
		}
	}
	return 1 / (n * c.maxReqs)
}

// inflight sums count's requests and tokens over the pool: the credits
// price a request of the pool's mean size.
func inflight(eps []*endpoints.Endpoint, count func(*endpoints.Endpoint) (requests, tokens int64)) (reqs, toks float64) {
	for _, e := range eps {
		r, t := count(e)
		reqs, toks = reqs+float64(r), toks+float64(t)
	}
	return reqs, toks
}

// allInflight counts every request in flight on e, remote prefills too.
func allInflight(e *endpoints.Endpoint) (requests, tokens int64) {
	return e.InflightRequests(), e.InflightTokens()
}

// Filter implements scheduling.Filter.
func (c *Concurrency) Filter(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	limR, limT := c.maxReqs*(1+c.headroom), c.maxToks*(1+c.headroom)
	keep := func(e *endpoints.Endpoint) bool {
		r, t := float64(e.InflightRequests()) < limR, float64(e.InflightTokens()) < limT
		switch c.mode {
		case ModeTokens:
			return t
		case ModeHybrid:
			return r && t
		default:
			return r
		}
	}
	return filterFailOpen(eps, keep)
}

var (
	_ flowcontrol.SaturationDetector = (*Utilization)(nil)
	_ flowcontrol.StaleCounter       = (*Utilization)(nil)
	_ flowcontrol.ReclaimCredit      = (*Utilization)(nil)
	_ scheduling.Filter              = (*Utilization)(nil)
	_ flowcontrol.SaturationDetector = (*Concurrency)(nil)
	_ flowcontrol.ReclaimCredit      = (*Concurrency)(nil)
	_ scheduling.Filter              = (*Concurrency)(nil)
)

// DecodeStepType is the registered type of kvgate's own saturation
// detector that measures a server by the decode step its in-flight
// requests make it run.
const DecodeStepType = "decode-step-detector"

// The values of decode-step-detector's aggregate parameter.
const (
	AggregateMin  = "min"
	AggregateMean = "mean"
)

// DecodeStep is decode-step-detector (kvgate's own; llm-d's detectors count
// queues, KV use or in-flight requests and tokens): a server's score is the
// decode step its in-flight requests make it run, over maxStep, the step
// priced by the decode roofline of an engine step (a fixed overhead for
// the weights and the host, a cost per sequence sampled, a cost per
// context token read),
//
//	stepOverhead + perSequence × in-flight requests + perContextToken × in-flight tokens
//
// (the tokens being the live load's prompt plus expected output). A budget
// in this unit is the step every online request on the server waits out
// and computes its prompt beside, which a token or a request count only
// approximates: a sequence costs the same host time however short it is.
//
// With aggregate min (the default) the pool's saturation is its least
// loaded server's: a sheddable band held below a ceiling c dispatches while
// some server's predicted step is under c × maxStep, and as a scorer it
// sends each sheddable request to the server whose step is shortest, so
// the sheddable load fills the servers up to one step length (the servers
// where protected traffic runs longer steps take less of it) instead of a
// pool total spread evenly by count. With aggregate mean the saturation is
// the mean over servers, a pool budget like concurrency-detector's.
// Protected requests are not scored.
//
// The defaults are the step of Llama-3.1-8B on one H100 in the bench's
// engine model (sim/engine/TIMING.md): 8 ms at one sequence, 16 µs of host
// time per sequence, 46 ns of KV read per context token (128 KiB at 85 %
// of 3.35 TB/s).
//
// Parameters:
//
//	maxStep: duration  the predicted step at saturation 1, > 0 (default "100ms")
//	stepOverhead: duration  the step's fixed cost, ≥ 0 (default "8ms")
//	perSequence: duration  each in-flight request's cost, ≥ 0 (default "16µs")
//	perContextToken: duration  each in-flight token's cost, ≥ 0 (default "46ns")
//	aggregate: string  min or mean (default min)
type DecodeStep struct {
	scheduling.Named
	maxStep, overhead, perSeq, perToken float64 // seconds
	mean                                bool
}

// DecodeStepParams are decode-step-detector's parameters.
type DecodeStepParams struct {
	MaxStep         *duration.Duration `json:"maxStep"`
	StepOverhead    *duration.Duration `json:"stepOverhead"`
	PerSequence     *duration.Duration `json:"perSequence"`
	PerContextToken *duration.Duration `json:"perContextToken"`
	Aggregate       string             `json:"aggregate"`
}

// NewDecodeStep is the plugin factory.
func NewDecodeStep(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p DecodeStepParams
	if err := scheduling.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	d := &DecodeStep{Named: scheduling.NewNamed(DecodeStepType, name),
		maxStep: 0.1, overhead: 0.008, perSeq: 16e-6, perToken: 46e-9}
	switch p.Aggregate {
	case "", AggregateMin:
	case AggregateMean:
		d.mean = true
	default:
		return nil, fmt.Errorf("parameters.aggregate must be %q or %q, got %q", AggregateMin, AggregateMean, p.Aggregate)
	}
	for _, f := range []struct {
		name     string
		v        *duration.Duration
		dst      *float64
		positive bool
	}{
		{"maxStep", p.MaxStep, &d.maxStep, true},
		{"stepOverhead", p.StepOverhead, &d.overhead, false},
		{"perSequence", p.PerSequence, &d.perSeq, false},
		{"perContextToken", p.PerContextToken, &d.perToken, false},
	} {
		if f.v == nil {
			continue
		}
		v := time.Duration(*f.v)
		if v < 0 || f.positive && v == 0 {
			return nil, fmt.Errorf("parameters.%s must be %s, got %v", f.name, map[bool]string{true: "> 0", false: "≥ 0"}[f.positive], v)
		}
		*f.dst = v.Seconds()
	}
	return d, nil
}

// Step is the decode step e's in-flight requests are predicted to make it
// run.
func (d *DecodeStep) Step(e *endpoints.Endpoint) time.Duration {
	return time.Duration(d.step(e) * 1e9)
}

// step prices the requests that decode on e: a P/D prefill server's
// remote prefills run no decode step there.
func (d *DecodeStep) step(e *endpoints.Endpoint) float64 {
	reqs, toks := e.DecodingInflight()
	return d.overhead + d.perSeq*float64(reqs) + d.perToken*float64(toks)
}

// score is e's saturation.
func (d *DecodeStep) score(e *endpoints.Endpoint) float64 { return d.step(e) / d.maxStep }

// Saturation implements flowcontrol.SaturationDetector; an empty pool is
// saturated.
func (d *DecodeStep) Saturation(eps []*endpoints.Endpoint) float64 {
	if len(eps) == 0 {
		return 1
	}
	agg := d.score(eps[0])
	for _, e := range eps[1:] {
		s := d.score(e)
		if d.mean {
			agg += s
		} else {
			agg = min(agg, s)
		}
	}
	if d.mean {
		agg /= float64(len(eps))
	}
	return agg
}

// Saturated reports a saturated pool (the director sheds sheddable
// requests without flow control).
func (d *DecodeStep) Saturated(eps []*endpoints.Endpoint) bool { return d.Saturation(eps) >= 1 }

// Credit implements flowcontrol.ReclaimCredit: what one request of the
// pool's mean size adds to the step of one server, spread over the pool
// under aggregate mean.
func (d *DecodeStep) Credit(eps []*endpoints.Endpoint) float64 {
	reqs, toks := inflight(eps, (*endpoints.Endpoint).DecodingInflight)
	c := d.perSeq
	if reqs > 0 {
		c += d.perToken * toks / reqs
	}
	if d.mean {
		c /= float64(max(1, len(eps)))
	}
	return c / d.maxStep
}

// Score implements scheduling.Scorer: a sheddable request scores the
// servers by their predicted step, shortest best.
func (d *DecodeStep) Score(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	if !flowcontrol.Sheddable(req.Priority) {
		return
	}
	scheduling.InverseMinMax(eps, scores, d.score)
}

var (
	_ flowcontrol.SaturationDetector = (*DecodeStep)(nil)
	_ flowcontrol.ReclaimCredit      = (*DecodeStep)(nil)
	_ scheduling.Scorer              = (*DecodeStep)(nil)
)
