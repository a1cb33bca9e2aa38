package async

import (
	"context"
	"math"
	"sync"
)

// Gate decides how much async work may dispatch now (llm-d-async's
// dispatch gates). A poll takes floor(batch_size × Budget) messages; each
// then passes Apply, which may reserve capacity until release is called
// (when the request's result is final or it goes back to a queue).
type Gate interface {
	// Budget is the share of capacity free for new async requests, in
	// [0, 1]; 0 holds dispatch. It never fails: a gate that cannot read
	// its signal returns its fallback.
	Budget(ctx context.Context) float64
	// Apply admits one message (ok) or refuses it, in which case the
	// message goes back to its queue under its deadline. release is nil
	// or must be called exactly once after an admission.
	Apply(ctx context.Context, m *Envelope) (ok bool, release func(), err error)
}

// openGate is llm-d-async's `constant` gate: always fully open.
type openGate struct{}

func (openGate) Budget(context.Context) float64 { return 1 }
func (openGate) Apply(context.Context, *Envelope) (bool, func(), error) {
	return true, nil, nil
}

// LocalConcurrency is the `local-max-concurrency` gate: at most limit
// admitted messages in flight; Budget is the free share of the limit.
type LocalConcurrency struct {
	mu       sync.Mutex
	limit    int
	inFlight int
}

// NewLocalConcurrency returns the gate; limit must be positive.
func NewLocalConcurrency(limit int) *LocalConcurrency { return &LocalConcurrency{limit: limit} }

// Budget implements Gate.
func (g *LocalConcurrency) Budget(context.Context) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight >= g.limit {
		return 0
	}
	return float64(g.limit-g.inFlight) / float64(g.limit)
}

// Apply implements Gate.
func (g *LocalConcurrency) Apply(context.Context, *Envelope) (bool, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight >= g.limit {
		return false, nil, nil
	}
	g.inFlight++
	var once sync.Once
	return true, func() {
		once.Do(func() {
			g.mu.Lock()
			g.inFlight--
			g.mu.Unlock()
		})
	}, nil
}

// InFlight is the number of admitted messages not yet released.
func (g *LocalConcurrency) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight
}

// Composite is the `composite` gate: the smallest budget of its gates, and
// an admission only when all admit (what the earlier ones reserved is
// released when a later one refuses).
type Composite []Gate

// Budget implements Gate.
func (c Composite) Budget(ctx context.Context) float64 {
	b := 1.0
	for _, g := range c {
		b = min(b, g.Budget(ctx))
	}
	return b
}

// Apply implements Gate.
func (c Composite) Apply(ctx context.Context, m *Envelope) (bool, func(), error) {
	var rels []func()
	undo := func() {
		for i := len(rels) - 1; i >= 0; i-- {
			rels[i]()
		}
	}
	for _, g := range c {
		ok, rel, err := g.Apply(ctx, m)
		if err != nil || !ok {
			undo()
			return false, nil, err
		}
		if rel != nil {
			rels = append(rels, rel)
		}
	}
	if len(rels) == 0 {
		return true, nil, nil
	}
	return true, undo, nil
}

// GateObserver receives a metric gate's readings (the gate_metric_* gauges).
type GateObserver interface {
	GateReading(value, threshold float64)
	GateSourceAvailable(ok bool)
}

type nopObserver struct{}

func (nopObserver) GateReading(float64, float64) {}
func (nopObserver) GateSourceAvailable(bool)     {}

// MetricGate turns a reading D of its Source into a budget: closed (0)
// when D ≤ threshold, else D − threshold clamped to [0, 1]; fallback when
// the source fails or has no usable sample. prometheus-saturation,
// prometheus-budget, prometheus-query and picker-saturation are all
// MetricGates over different sources.
type MetricGate struct {
	Source    Source
	Threshold float64
	Fallback  float64
	Observer  GateObserver
}

// Budget implements Gate.
func (g *MetricGate) Budget(ctx context.Context) float64 {
	obs := g.Observer
	if obs == nil {
		obs = nopObserver{}
	}
	v, err := g.Source.Read(ctx)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		obs.GateSourceAvailable(false)
		return clamp01(g.Fallback)
	}
	obs.GateReading(v, g.Threshold)
	obs.GateSourceAvailable(true)
	if v <= g.Threshold {
		return 0
	}
	return clamp01(v - g.Threshold)
}

// Apply implements Gate.
func (g *MetricGate) Apply(ctx context.Context, _ *Envelope) (bool, func(), error) {
	return g.Budget(ctx) > 0, nil, nil
}

func clamp01(v float64) float64 { return max(0, min(1, v)) }
