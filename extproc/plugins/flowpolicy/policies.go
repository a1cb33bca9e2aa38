package flowpolicy

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registered plugin types.
const (
	GlobalStrictType = "global-strict-fairness-policy"
	RoundRobinType   = "round-robin-fairness-policy"
	ProgramAwareType = "program-aware-fairness"
	FCFSType         = "fcfs-ordering-policy"
	EDFType          = "edf-ordering-policy"
	SLODeadlineType  = "slo-deadline-ordering-policy"
	StaticLimitType  = "static-usage-limit-policy"
	HoldbackType     = "priority-holdback-policy"
	SoftReflectType  = "soft-reflective-ceiling-policy"
	UtilizationType  = "utilization-detector"
	ConcurrencyType  = "concurrency-detector"
)

// GlobalStrict is global-strict-fairness-policy: no fairness, the band is
// one queue in its ordering policy's order (the flow whose head comes
// first dispatches).
//
// Parameters: none.
type GlobalStrict struct{ scheduling.Named }

// NewGlobalStrict is the plugin factory.
func NewGlobalStrict(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(GlobalStrictType, name, params)
	return &GlobalStrict{n}, err
}

// Pick implements flowcontrol.FairnessPolicy.
func (GlobalStrict) Pick(b flowcontrol.Band) *flowcontrol.Flow {
	var best *flowcontrol.Flow
	for _, f := range b.Flows() {
		if best == nil || b.Less(f.Head(), best.Head()) {
			best = f
		}
	}
	return best
}

// RoundRobin is round-robin-fairness-policy: the band's flows take turns,
// in fairness-id order, one dispatch each.
//
// Parameters: none.
type RoundRobin struct{ scheduling.Named }

// NewRoundRobin is the plugin factory.
func NewRoundRobin(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(RoundRobinType, name, params)
	return &RoundRobin{n}, err
}

// Pick implements flowcontrol.FairnessPolicy: the first flow after the
// last one served (flows are sorted by fairness id; a flow that emptied
// and came back keeps its place in that order).
func (RoundRobin) Pick(b flowcontrol.Band) *flowcontrol.Flow {
	flows := b.Flows()
	if len(flows) == 0 {
		return nil
	}
	cur := b.Cursor()
	pick := flows[0]
	for _, f := range flows {
		if strings.Compare(f.FairnessID(), *cur) > 0 {
			pick = f
			break
		}
	}
	*cur = pick.FairnessID()
	return pick
}

// FCFS is fcfs-ordering-policy: first come, first served by arrival at the
// flow-control layer.
//
// Parameters: none.
type FCFS struct{ scheduling.Named }

// NewFCFS is the plugin factory.
func NewFCFS(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(FCFSType, name, params)
	return &FCFS{n}, err
}

// Less implements flowcontrol.OrderingPolicy.
func (FCFS) Less(x, y *flowcontrol.Item) bool { return fcfs(x, y) }

func fcfs(x, y *flowcontrol.Item) bool {
	if c := x.EnqueueTime().Compare(y.EnqueueTime()); c != 0 {
		return c < 0
	}
	return x.Seq() < y.Seq()
}

// EDF is edf-ordering-policy: earliest deadline first, the deadline being
// the enqueue time plus the TTL in force (or the client's own deadline when
// sooner); requests without one go after every request with one, FCFS
// among equals.
//
// Parameters: none.
type EDF struct{ scheduling.Named }

// NewEDF is the plugin factory.
func NewEDF(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(EDFType, name, params)
	return &EDF{n}, err
}

// Less implements flowcontrol.OrderingPolicy.
func (EDF) Less(x, y *flowcontrol.Item) bool {
	dx, okx := x.Deadline()
	dy, oky := y.Deadline()
	return deadlineLess(dx, okx, dy, oky, x, y, fcfs)
}

func deadlineLess(dx time.Time, okx bool, dy time.Time, oky bool, x, y *flowcontrol.Item, tie func(x, y *flowcontrol.Item) bool) bool {
	switch {
	case okx && !oky:
		return true
	case !okx && oky:
		return false
	case okx && oky && !dx.Equal(dy):
		return dx.Before(dy)
	}
	return tie(x, y)
}

// SLODeadline is slo-deadline-ordering-policy: earliest deadline first, the
// deadline being the request's receipt plus its x-llm-d-slo-ttft-ms (or the
// deprecated x-slo-ttft-ms); requests without one go after every request
// with one; ties by receipt time.
//
// Parameters: none.
type SLODeadline struct{ scheduling.Named }

// NewSLODeadline is the plugin factory.
func NewSLODeadline(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(SLODeadlineType, name, params)
	return &SLODeadline{n}, err
}

// Less implements flowcontrol.OrderingPolicy.
func (SLODeadline) Less(x, y *flowcontrol.Item) bool {
	rx, ry := x.Request(), y.Request()
	dx, dy := rx.ReceivedAt.Add(rx.TTFTSLO), ry.ReceivedAt.Add(ry.TTFTSLO)
	return deadlineLess(dx, rx.TTFTSLO > 0, dy, ry.TTFTSLO > 0, x, y, byReceipt)
}

func byReceipt(x, y *flowcontrol.Item) bool {
	if c := x.Request().ReceivedAt.Compare(y.Request().ReceivedAt); c != 0 {
		return c < 0
	}
	return x.Seq() < y.Seq()
}

// StaticLimit is static-usage-limit-policy: one ceiling for every band.
//
// Parameters:
//
//	threshold: float  dispatch while saturation is below it, in (0, 1] (default 1.0: no gating below saturation)
type StaticLimit struct {
	scheduling.Named
	threshold float64
}

// StaticLimitParams are static-usage-limit-policy's parameters.
type StaticLimitParams struct {
	Threshold *float64 `json:"threshold"`
}

// NewStaticLimit is the plugin factory.
func NewStaticLimit(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p StaticLimitParams
	if err := scheduling.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	t := 1.0
	if p.Threshold != nil {
		t = *p.Threshold
	}
	if !(t > 0 && t <= 1) {
		return nil, fmt.Errorf("parameters.threshold must be in (0, 1], got %v", t)
	}
	return &StaticLimit{scheduling.NewNamed(StaticLimitType, name), t}, nil
}

// Ceilings implements flowcontrol.UsageLimitPolicy.
func (s *StaticLimit) Ceilings(_ float64, _ []int, ceilings []float64) {
	for i := range ceilings {
		ceilings[i] = s.threshold
	}
}

// Holdback is priority-holdback-policy: ceilings spaced linearly from
// maxCeiling (highest priority) to minCeiling (lowest), so that lower
// priorities are held back first as saturation rises.
//
// Parameters:
//
//	shape: string  interpolation, only "linear" (default linear)
//	domain: string  "rank" spaces bands evenly by rank, "value" by priority value (default rank)
//	minCeiling: float  the lowest band's ceiling, in [0, 1) (required)
//	maxCeiling: float  the highest band's ceiling, in (0, 1] (default 1.0)
type Holdback struct {
	scheduling.Named
	byValue  bool
	min, max float64
}

// HoldbackParams are priority-holdback-policy's parameters.
type HoldbackParams struct {
	Shape      string   `json:"shape"`
	Domain     string   `json:"domain"`
	MinCeiling *float64 `json:"minCeiling"`
	MaxCeiling *float64 `json:"maxCeiling"`
}

// NewHoldback is the plugin factory.
func NewHoldback(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p HoldbackParams
	if err := scheduling.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	h := &Holdback{Named: scheduling.NewNamed(HoldbackType, name), max: 1}
	switch p.Shape {
	case "", "linear":
	default:
		return nil, fmt.Errorf("parameters.shape: only \"linear\" is supported, got %q", p.Shape)
	}
	switch p.Domain {
	case "", "rank":
	case "value":
		h.byValue = true
	default:
		return nil, fmt.Errorf("parameters.domain must be \"rank\" or \"value\", got %q", p.Domain)
	}
	if p.MinCeiling == nil {
		return nil, fmt.Errorf("parameters.minCeiling is required")
	}
	h.min = *p.MinCeiling
	if p.MaxCeiling != nil {
		h.max = *p.MaxCeiling
	}
	switch {
	case !(h.min >= 0 && h.min < 1):
		return nil, fmt.Errorf("parameters.minCeiling must be in [0, 1), got %v", h.min)
	case !(h.max > 0 && h.max <= 1):
		return nil, fmt.Errorf("parameters.maxCeiling must be in (0, 1], got %v", h.max)
	case h.min > h.max:
		return nil, fmt.Errorf("parameters.minCeiling %v exceeds maxCeiling %v", h.min, h.max)
	}
	return h, nil
}

// Ceilings implements flowcontrol.UsageLimitPolicy.
func (h *Holdback) Ceilings(_ float64, priorities []int, ceilings []float64) {
	n := len(priorities)
	if n == 0 {
		return
	}
	hi, lo := priorities[0], priorities[n-1]
	for i := range ceilings {
		switch {
		case n == 1 || (h.byValue && hi == lo):
			ceilings[i] = h.max
		case h.byValue:
			r := float64(priorities[i]-lo) / float64(hi-lo)
			ceilings[i] = h.min + r*(h.max-h.min)
		default:
			ceilings[i] = h.max - float64(i)*(h.max-h.min)/float64(n-1)
		}
	}
}

// SoftReflect is soft-reflective-ceiling-policy: band i's ceiling is
// 1 − i·s/(N−1) at saturation s; a band at or past it alternates open and
// closed, open one call in round(s/(1−s)), so its dispatch rate falls
// continuously as saturation rises; at s ≥ 1 every band but the highest
// is closed.
//
// Parameters: none.
type SoftReflect struct {
	scheduling.Named
	mu   sync.Mutex
	tick uint64
}

// NewSoftReflect is the plugin factory.
func NewSoftReflect(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(SoftReflectType, name, params)
	return &SoftReflect{Named: n}, err
}

// Ceilings implements flowcontrol.UsageLimitPolicy.
func (s *SoftReflect) Ceilings(sat float64, priorities []int, ceilings []float64) {
	n := len(priorities)
	if n < 2 {
		return
	}
	s.mu.Lock()
	s.tick++
	tick := s.tick
	s.mu.Unlock()
	open := false
	if sat > 0 && sat < 1 {
		period := uint64(max(1, math.Round(sat/(1-sat))))
		open = tick%period == 0
	}
	for i := 1; i < n; i++ {
		reflect := 1 - float64(i)*sat/float64(n-1)
		switch {
		case sat < reflect:
			ceilings[i] = 1
		case sat >= 1 || !open:
			ceilings[i] = 0
		default:
			ceilings[i] = 1
		}
	}
}

var (
	_ flowcontrol.FairnessPolicy   = GlobalStrict{}
	_ flowcontrol.FairnessPolicy   = RoundRobin{}
	_ flowcontrol.OrderingPolicy   = FCFS{}
	_ flowcontrol.OrderingPolicy   = EDF{}
	_ flowcontrol.OrderingPolicy   = SLODeadline{}
	_ flowcontrol.UsageLimitPolicy = (*StaticLimit)(nil)
	_ flowcontrol.UsageLimitPolicy = (*Holdback)(nil)
	_ flowcontrol.UsageLimitPolicy = (*SoftReflect)(nil)
)
