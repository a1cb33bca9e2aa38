package flowpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/server"
)

// MaxPrograms bounds the programs program-aware-fairness keeps state for;
// beyond it, idle programs are dropped first and a new program waits for
// room (it is scored as one with no attained service).
const MaxPrograms = 4096

// ProgramAware is program-aware-fairness with the las (least attained
// service) strategy: each program (fairness id) accumulates weighted
// tokens as its requests complete (output tokens weigh twice input ones),
// decaying with a half-life; the band's flow with the best score
//
//	lasWeightService·(1 − norm(service)) + lasWeightHeadWait·norm(head wait)
//
// dispatches, both terms min-max normalised over the flows waiting.
// Programs idle (no completion, nothing in flight) for evictionTtlSeconds
// are forgotten, checked every evictionSweepSeconds. With the
// ServiceRegisterer service it exports llm-d's
// llm_d_epp_program_aware_{jains_fairness_index, avg_wait_time_milliseconds,
// attained_service_tokens}.
//
// The turn-priority strategy (llm-d's) scores a flow instead by
//
//	turnNumber + turnPriorityTimeWeight·(head wait, seconds)
//
// where turnNumber is the program's dispatched requests plus one: deeper
// sessions, whose prefix is most likely still cached, dispatch first and a
// shallower one ages up while its head waits (equal scores: the longer
// wait). A program with nothing in flight whose head arrived more than
// turnPriorityInactivitySeconds after its last completion, the shared
// default-flow and a program without state score turn one. It keeps no
// attained service and exports no attained_service_tokens.
//
// Parameters:
//
//	strategy: string  "las" or "turn-priority" (default las)
//	lasWeightService: float  weight of the inverted attained service (default 0.8)
//	lasWeightHeadWait: float  weight of the head request's wait (default 0.2)
//	lasHalfLifeSeconds: float  half-life of attained service, 0 for none (default 60)
//	evictionTtlSeconds: float  idle time after which a program is forgotten (default 3600)
//	evictionSweepSeconds: float  interval of the idle sweep, > 0 (default 300)
//	turnPriorityTimeWeight: float  turns a second of head wait is worth (default 0.5)
//	turnPriorityInactivitySeconds: float  idle gap that resets a program to turn one, 0 for none (default 120)
type ProgramAware struct {
	scheduling.Named
	p   ProgramAwareParams
	now func() time.Time

	metrics *programMetrics // nil: not exported

	mu        sync.Mutex
	programs  map[string]*program
	lastSweep time.Time
	scratch   []pick
}

// ProgramAwareParams are program-aware-fairness's parameters.
type ProgramAwareParams struct {
	Strategy             string   `json:"strategy"`
	LASWeightService     *float64 `json:"lasWeightService"`
	LASWeightHeadWait    *float64 `json:"lasWeightHeadWait"`
	LASHalfLifeSeconds   *float64 `json:"lasHalfLifeSeconds"`
	EvictionTTLSeconds   *float64 `json:"evictionTtlSeconds"`
	EvictionSweepSeconds *float64 `json:"evictionSweepSeconds"`

	TurnPriorityTimeWeight        *float64 `json:"turnPriorityTimeWeight"`
	TurnPriorityInactivitySeconds *float64 `json:"turnPriorityInactivitySeconds"`
}

// TurnPriority is program-aware-fairness's turn-priority strategy name.
const TurnPriority = "turn-priority"

type program struct {
	service  float64
	at       time.Time // when service was last decayed
	last     time.Time // last completion (or first sight)
	inFlight int
	// dispatched counts its requests routed (turn-priority's depth).
	dispatched int64
	// meanWait is the running mean of its dispatched requests' queue wait
	// (ms) over waits of them.
	meanWait float64
	waits    int64
}

type pick struct {
	f       *flowcontrol.Flow
	service float64
	wait    float64
}

// NewProgramAware is the plugin factory.
func NewProgramAware(name string, params json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var raw ProgramAwareParams
	if err := scheduling.DecodeParams(params, &raw); err != nil {
		return nil, err
	}
	def := func(v *float64, d float64) *float64 {
		if v == nil {
			return &d
		}
		return v
	}
	p := ProgramAwareParams{
		Strategy:             raw.Strategy,
		LASWeightService:     def(raw.LASWeightService, 0.8),
		LASWeightHeadWait:    def(raw.LASWeightHeadWait, 0.2),
		LASHalfLifeSeconds:   def(raw.LASHalfLifeSeconds, 60),
		EvictionTTLSeconds:   def(raw.EvictionTTLSeconds, 3600),
		EvictionSweepSeconds: def(raw.EvictionSweepSeconds, 300),

		TurnPriorityTimeWeight:        def(raw.TurnPriorityTimeWeight, 0.5),
		TurnPriorityInactivitySeconds: def(raw.TurnPriorityInactivitySeconds, 120),
	}
	switch {
	case p.Strategy != "" && p.Strategy != "las" && p.Strategy != TurnPriority:
		return nil, fmt.Errorf("parameters.strategy must be \"las\" or %q, got %q", TurnPriority, p.Strategy)
	case *p.TurnPriorityTimeWeight < 0 || *p.TurnPriorityInactivitySeconds < 0:
		return nil, fmt.Errorf("parameters: turnPriorityTimeWeight and turnPriorityInactivitySeconds must not be negative")
	case *p.LASWeightService < 0 || *p.LASWeightHeadWait < 0:
		return nil, fmt.Errorf("parameters: weights must not be negative")
	case *p.LASHalfLifeSeconds < 0 || *p.EvictionTTLSeconds < 0:
		return nil, fmt.Errorf("parameters: lasHalfLifeSeconds and evictionTtlSeconds must not be negative")
	case !(*p.EvictionSweepSeconds > 0):
		return nil, fmt.Errorf("parameters.evictionSweepSeconds must be > 0, got %v", *p.EvictionSweepSeconds)
	}
	a := &ProgramAware{Named: scheduling.NewNamed(ProgramAwareType, name), p: p, now: scheduling.NowOf(h), programs: map[string]*program{}}
	if reg, ok := scheduling.Service[prometheus.Registerer](h, ServiceRegisterer); ok {
		m, err := newProgramMetrics(reg, p.Strategy != TurnPriority)
		if err != nil {
			return nil, fmt.Errorf("program-aware-fairness metrics: %w", err)
		}
		a.metrics = m
	}
	return a, nil
}

// decayed brings a program's service to now.
func (a *ProgramAware) decayed(pr *program, now time.Time) float64 {
	if hl := *a.p.LASHalfLifeSeconds; hl > 0 && now.After(pr.at) {
		pr.service *= math.Exp2(-now.Sub(pr.at).Seconds() / hl)
	}
	pr.at = now
	return pr.service
}

// get returns the program's state, creating it when there is room; nil
// when there is none.
func (a *ProgramAware) get(id string, now time.Time) *program {
	if pr, ok := a.programs[id]; ok {
		return pr
	}
	a.sweep(now, len(a.programs) >= MaxPrograms)
	if len(a.programs) >= MaxPrograms {
		return nil
	}
	pr := &program{at: now, last: now}
	a.programs[id] = pr
	return pr
}

// sweep forgets idle programs, at most every evictionSweepSeconds unless
// forced (the map is full).
func (a *ProgramAware) sweep(now time.Time, force bool) {
	if !force && now.Sub(a.lastSweep).Seconds() < *a.p.EvictionSweepSeconds {
		return
	}
	a.lastSweep = now
	ttl := *a.p.EvictionTTLSeconds
	for id, pr := range a.programs {
		if pr.inFlight == 0 && now.Sub(pr.last).Seconds() >= ttl {
			delete(a.programs, id)
			if a.metrics != nil {
				a.metrics.wait.DeleteLabelValues(id)
				a.metrics.service.DeleteLabelValues(id)
			}
		}
	}
}

// Pick implements flowcontrol.FairnessPolicy.
func (a *ProgramAware) Pick(b flowcontrol.Band) *flowcontrol.Flow {
	flows := b.Flows()
	if len(flows) == 0 {
		return nil
	}
	now := b.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(flows) == 1 {
		a.dispatched(flows[0], now)
		return flows[0]
	}
	a.sweep(now, false)
	if a.p.Strategy == TurnPriority {
		best := a.deepest(flows, now)
		a.dispatched(best, now)
		return best
	}
	a.scratch = a.scratch[:0]
	minS, maxS, minW, maxW := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, f := range flows {
		s := 0.0
		if pr, ok := a.programs[f.FairnessID()]; ok {
			s = a.decayed(pr, now)
		}
		w := float64(now.Sub(f.Head().EnqueueTime()).Milliseconds())
		a.scratch = append(a.scratch, pick{f, s, w})
		minS, maxS, minW, maxW = min(minS, s), max(maxS, s), min(minW, w), max(maxW, w)
	}
	norm := func(v, lo, hi float64) float64 {
		if hi <= lo {
			return 0
		}
		return (v - lo) / (hi - lo)
	}
	best, bestScore := a.scratch[0].f, math.Inf(-1)
	for _, c := range a.scratch {
		score := *a.p.LASWeightService*(1-norm(c.service, minS, maxS)) + *a.p.LASWeightHeadWait*norm(c.wait, minW, maxW)
		if score > bestScore {
			best, bestScore = c.f, score
		}
	}
	clear(a.scratch)
	a.dispatched(best, now)
	return best
}

// deepest is turn-priority's pick: the highest turn number plus weighted
// head wait, the longer wait on a tie.
func (a *ProgramAware) deepest(flows []*flowcontrol.Flow, now time.Time) *flowcontrol.Flow {
	var best *flowcontrol.Flow
	bestScore, bestWait := math.Inf(-1), math.Inf(-1)
	for _, f := range flows {
		enq := f.Head().EnqueueTime()
		wait := max(0, now.Sub(enq).Seconds())
		score := float64(a.turn(f.FairnessID(), enq)) + *a.p.TurnPriorityTimeWeight*wait
		if score > bestScore || (score == bestScore && wait > bestWait) {
			best, bestScore, bestWait = f, score, wait
		}
	}
	return best
}

// turn is the turn number of a program's head request that arrived at
// arrived: the idle gap runs to its arrival, so its own queue wait does not
// reset the program. default-flow sums unrelated clients: no session depth.
func (a *ProgramAware) turn(id string, arrived time.Time) int64 {
	pr, ok := a.programs[id]
	if !ok || id == server.DefaultFairnessID {
		return 1
	}
	if idle := *a.p.TurnPriorityInactivitySeconds; idle > 0 && pr.inFlight == 0 && arrived.Sub(pr.last).Seconds() > idle {
		return 1
	}
	return pr.dispatched + 1
}

// dispatched records the wait of the request f dispatches now (its head).
func (a *ProgramAware) dispatched(f *flowcontrol.Flow, now time.Time) {
	pr := a.get(f.FairnessID(), now)
	if pr == nil {
		return
	}
	w := float64(now.Sub(f.Head().EnqueueTime()).Milliseconds())
	pr.waits++
	pr.meanWait += (w - pr.meanWait) / float64(pr.waits)
	if a.metrics != nil {
		a.metrics.wait.WithLabelValues(f.FairnessID()).Set(finite(pr.meanWait))
		a.metrics.jain.Set(jains(a.programs))
	}
}

// PreRequest implements scheduling.PreRequest: the program has a request
// in flight (it is not forgotten while it has).
func (a *ProgramAware) PreRequest(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, _ *scheduling.Result) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pr := a.get(req.FairnessID, a.now()); pr != nil {
		pr.inFlight++
		pr.dispatched++
	}
}

// ResponseComplete implements scheduling.ResponseComplete: the program's
// attained service grows by the request's weighted tokens.
func (a *ProgramAware) ResponseComplete(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, res *scheduling.Response) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	pr := a.get(req.FairnessID, now)
	if pr == nil {
		return
	}
	pr.inFlight = max(0, pr.inFlight-1)
	pr.last = now
	if a.p.Strategy == TurnPriority {
		return
	}
	a.decayed(pr, now)
	pr.service += float64(res.Usage.PromptTokens) + 2*float64(res.Usage.CompletionTokens)
	if a.metrics != nil {
		a.metrics.service.WithLabelValues(req.FairnessID).Set(finite(pr.service))
	}
}

// Service is a program's attained service now (for tests and reports).
func (a *ProgramAware) Service(id string) float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pr, ok := a.programs[id]; ok {
		return a.decayed(pr, a.now())
	}
	return 0
}

var (
	_ flowcontrol.FairnessPolicy  = (*ProgramAware)(nil)
	_ scheduling.PreRequest       = (*ProgramAware)(nil)
	_ scheduling.ResponseComplete = (*ProgramAware)(nil)
)
