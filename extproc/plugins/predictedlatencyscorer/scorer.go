package predictedlatencyscorer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/plugins/latencyscorer"
	"github.com/kvgate/kvgate/extproc/plugins/predictedlatency"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/duration"
)

// Type is the registered plugin type.
const Type = "predicted-latency-scorer"

// Headroom selection strategies.
const (
	StrategyLeast          = latencyscorer.StrategyLeast
	StrategyMost           = latencyscorer.StrategyMost
	StrategyCompositeLeast = "composite-least"
	StrategyCompositeMost  = "composite-most"
	StrategyCompositeOnly  = "composite-only"
)

// Selection modes.
const (
	SelectionLinear = "linear"
	SelectionMax    = "max"
)

// Params are the plugin's parameters.
type Params struct {
	SamplingMean              float64        `json:"samplingMean"`
	MaxSampledTokens          int            `json:"maxSampledTokens"`
	SLOBufferFactor           float64        `json:"sloBufferFactor"`
	NegHeadroomTTFTWeight     float64        `json:"negHeadroomTTFTWeight"`
	NegHeadroomTPOTWeight     float64        `json:"negHeadroomTPOTWeight"`
	HeadroomTTFTWeight        float64        `json:"headroomTTFTWeight"`
	HeadroomTPOTWeight        float64        `json:"headroomTPOTWeight"`
	HeadroomSelectionStrategy string         `json:"headroomSelectionStrategy"`
	CompositeKVWeight         float64        `json:"compositeKVWeight"`
	CompositeQueueWeight      float64        `json:"compositeQueueWeight"`
	CompositePrefixWeight     float64        `json:"compositePrefixWeight"`
	EpsilonExploreSticky      float64        `json:"epsilonExploreSticky"`
	EpsilonExploreNeg         float64        `json:"epsilonExploreNeg"`
	AffinityGateTau           float64        `json:"affinityGateTau"`
	AffinityGateTauGlobal     float64        `json:"affinityGateTauGlobal"`
	AffinityMaxTTFTPenaltyMs  float64        `json:"affinityMaxTTFTPenaltyMs"`
	ContextTTL                duration.Nanos `json:"contextTTL"`
	SelectionMode             string         `json:"selectionMode"`
	StreamingMode             bool           `json:"streamingMode"`
	EndpointRoleLabel         string         `json:"endpointRoleLabel"`
}

// Defaults (GIE v1.5's).
const (
	DefaultSamplingMean = 1000
	DefaultContextTTL   = 5 * time.Minute
	coldKVUsage         = 0.02
)

func defaults() Params {
	return Params{
		SamplingMean: DefaultSamplingMean, SLOBufferFactor: 1,
		NegHeadroomTTFTWeight: 0.8, NegHeadroomTPOTWeight: 0.2, HeadroomTTFTWeight: 0.8, HeadroomTPOTWeight: 0.2,
		HeadroomSelectionStrategy: StrategyLeast,
		CompositeKVWeight:         1, CompositeQueueWeight: 1, CompositePrefixWeight: 1,
		EpsilonExploreSticky: 0.01, EpsilonExploreNeg: 0.01,
		AffinityGateTau: 0.80, AffinityGateTauGlobal: 0.99, AffinityMaxTTFTPenaltyMs: 5000,
		SelectionMode: SelectionLinear, StreamingMode: true, ContextTTL: duration.Nanos(DefaultContextTTL),
	}
}

// ErrNoValidEndpoint is the admitter's refusal of a sheddable request.
var ErrNoValidEndpoint = errors.New("no endpoint is predicted to meet the sheddable request's latency SLO")

// Scorer implements predicted-latency-scorer.
type Scorer struct {
	scheduling.Named
	params Params
	prod   *predictedlatency.Producer
	rand   scheduling.Rand

	// running holds, per endpoint address, the requests this scorer routed
	// there that have not ended, with their TPOT SLO (ms, 0 for none); it
	// is bounded by the in-flight requests (every routed request ends in
	// ResponseComplete) and by the pool (EndpointsRemoved). A request finds
	// its entry through its cycle state, so request IDs need not be unique.
	mu      sync.Mutex
	running map[string]map[*run]struct{}
	runKey  scheduling.Key[*run]
}

// run is one routed request that has not ended.
type run struct {
	addr string
	tpot float64
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p := defaults()
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	prodParams, err := json.Marshal(map[string]any{
		"streamingMode":     p.StreamingMode,
		"endpointRoleLabel": p.EndpointRoleLabel,
		"contextTTL":        p.ContextTTL,
	})
	if err != nil {
		return nil, err
	}
	prod, err := predictedlatency.New(name, prodParams, h)
	if err != nil {
		return nil, err
	}
	n := scheduling.NewNamed(Type, name)
	return &Scorer{
		Named:   n,
		params:  p,
		prod:    prod.(*predictedlatency.Producer),
		rand:    scheduling.RandOf(h),
		running: map[string]map[*run]struct{}{},
		runKey:  scheduling.NewKey[*run](n.TypedName().String() + "/running"),
	}, nil
}

func (p *Params) validate() error {
	var errs []error
	if p.SamplingMean != DefaultSamplingMean {
		errs = append(errs, &scheduling.UnsupportedParameterError{Param: "samplingMean",
			Reason: fmt.Sprintf("it tunes GIE's sidecar TPOT sampling; kvgate measures TPOT over the whole stream and accepts only %d", DefaultSamplingMean)})
	}
	if p.MaxSampledTokens != 0 {
		errs = append(errs, &scheduling.UnsupportedParameterError{Param: "maxSampledTokens",
			Reason: "it tunes GIE's sidecar TPOT sampling; kvgate measures TPOT over the whole stream and accepts only 0"})
	}
	if !(p.SLOBufferFactor > 0) {
		errs = append(errs, fmt.Errorf("parameters.sloBufferFactor must be > 0, got %v", p.SLOBufferFactor))
	}
	nonNeg := []struct {
		name string
		v    float64
	}{
		{"negHeadroomTTFTWeight", p.NegHeadroomTTFTWeight}, {"negHeadroomTPOTWeight", p.NegHeadroomTPOTWeight},
		{"headroomTTFTWeight", p.HeadroomTTFTWeight}, {"headroomTPOTWeight", p.HeadroomTPOTWeight},
		{"compositeKVWeight", p.CompositeKVWeight}, {"compositeQueueWeight", p.CompositeQueueWeight},
		{"compositePrefixWeight", p.CompositePrefixWeight}, {"affinityMaxTTFTPenaltyMs", p.AffinityMaxTTFTPenaltyMs},
	}
	for _, w := range nonNeg {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			errs = append(errs, fmt.Errorf("parameters.%s must be a finite number >= 0, got %v", w.name, w.v))
		}
	}
	unit := []struct {
		name string
		v    float64
	}{
		{"epsilonExploreSticky", p.EpsilonExploreSticky}, {"epsilonExploreNeg", p.EpsilonExploreNeg},
		{"affinityGateTau", p.AffinityGateTau}, {"affinityGateTauGlobal", p.AffinityGateTauGlobal},
	}
	for _, u := range unit {
		if !(u.v >= 0 && u.v <= 1) {
			errs = append(errs, fmt.Errorf("parameters.%s must be in [0, 1], got %v", u.name, u.v))
		}
	}
	switch p.HeadroomSelectionStrategy {
	case StrategyLeast, StrategyMost, StrategyCompositeLeast, StrategyCompositeMost, StrategyCompositeOnly:
	default:
		errs = append(errs, fmt.Errorf("parameters.headroomSelectionStrategy: want one of %q, %q, %q, %q, %q, got %q",
			StrategyLeast, StrategyMost, StrategyCompositeLeast, StrategyCompositeMost, StrategyCompositeOnly, p.HeadroomSelectionStrategy))
	}
	if p.SelectionMode != SelectionLinear && p.SelectionMode != SelectionMax {
		errs = append(errs, fmt.Errorf("parameters.selectionMode: want %q or %q, got %q", SelectionLinear, SelectionMax, p.SelectionMode))
	}
	return errors.Join(errs...)
}

// Model is the latency model the scorer predicts with and trains.
func (s *Scorer) Model() *latency.Model { return s.prod.Model() }

// Produces implements scheduling.DataDependencies.
func (s *Scorer) Produces() []string { return s.prod.Produces() }

// Consumes implements scheduling.DataDependencies.
func (s *Scorer) Consumes() []string { return s.prod.Consumes() }

// Produce implements scheduling.DataProducer: the predictions.
func (s *Scorer) Produce(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) {
	s.prod.Produce(ctx, cs, req, eps)
}

// PreRequest implements scheduling.PreRequest: the request counts as
// running on its endpoint, with its TPOT SLO, until it ends.
func (s *Scorer) PreRequest(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, res *scheduling.Result) {
	s.prod.PreRequest(ctx, cs, req, res)
	primary := res.Primary()
	if primary == nil || len(primary.Targets) == 0 {
		return
	}
	r := &run{addr: primary.Targets[0].Address(), tpot: ms(req.TPOTSLO)}
	scheduling.Write(cs, s.runKey, r)
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.running[r.addr]
	if m == nil {
		m = map[*run]struct{}{}
		s.running[r.addr] = m
	}
	m[r] = struct{}{}
}

// FirstToken implements scheduling.FirstToken (training).
func (s *Scorer) FirstToken(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, res *scheduling.Response) {
	s.prod.FirstToken(ctx, cs, req, res)
}

// ResponseComplete implements scheduling.ResponseComplete: training, and
// the request stops running.
func (s *Scorer) ResponseComplete(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, res *scheduling.Response) {
	s.prod.ResponseComplete(ctx, cs, req, res)
	r, ok := scheduling.Read(cs, s.runKey)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.running[r.addr]; m != nil {
		delete(m, r)
		if len(m) == 0 {
			delete(s.running, r.addr)
		}
	}
}

// EndpointsRemoved implements scheduling.EndpointsRemoved.
func (s *Scorer) EndpointsRemoved(addresses []string) {
	s.prod.EndpointsRemoved(addresses)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range addresses {
		delete(s.running, a)
	}
}

// runningOf is the number of this scorer's requests running on addr and
// the smallest TPOT SLO among them (0 when any has none, as GIE's
// min-queue reports).
func (s *Scorer) runningOf(addr string) (n int, minTPOT float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.running[addr]
	minTPOT = math.Inf(1)
	for r := range m {
		minTPOT = min(minTPOT, r.tpot)
	}
	if len(m) == 0 {
		minTPOT = 0
	}
	return len(m), minTPOT
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var (
	_ scheduling.Scorer           = (*Scorer)(nil)
	_ scheduling.Admitter         = (*Scorer)(nil)
	_ scheduling.DataProducer     = (*Scorer)(nil)
	_ scheduling.DataDependencies = (*Scorer)(nil)
	_ scheduling.PreRequest       = (*Scorer)(nil)
	_ scheduling.FirstToken       = (*Scorer)(nil)
	_ scheduling.ResponseComplete = (*Scorer)(nil)
	_ scheduling.EndpointsRemoved = (*Scorer)(nil)
)
