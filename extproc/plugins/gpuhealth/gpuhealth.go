// Package gpuhealth holds the GPU-health plugins, which route on the node
// agents' NVML telemetry (extproc/telemetry): gpu-health-filter drops the
// endpoints whose GPUs had an XID critical error recently or throttle for
// a reason it is told to drop; gpu-health-scorer rates every endpoint in
// [0, 1], 0 after a recent XID error, less for each throttle group.
//
// Endpoints without fresh telemetry (no agent on their node, an agent
// down, a GPU-less node) count as healthy: a missing agent never takes
// servers out of the pool. The filter keeps every candidate when it would
// drop them all, so that a fleet-wide event (a driver bug raising the same
// XID everywhere) degrades routing to health-blind instead of failing
// every request.
//
// XID codes the NVIDIA XID catalog attributes to the application rather
// than the GPU (13 graphics engine exception, 31 memory page fault, 43
// stopped processing, 45 preemptive cleanup) are ignored by default. The
// decision reads the GPU's last XID only.
//
// Both need the picker's telemetry stream (kvgate epp --telemetry-agents
// or --telemetry-agent-selector); configuring them without it is an error.
package gpuhealth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/telemetry"
	"github.com/kvgate/kvgate/internal/duration"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// Registered plugin types.
const (
	FilterType = "gpu-health-filter"
	ScorerType = "gpu-health-scorer"
)

// ErrNoTelemetry is returned by the factories of a picker without the
// telemetry stream.
var ErrNoTelemetry = errors.New("needs the node agents' telemetry stream (kvgate epp --telemetry-agents or --telemetry-agent-selector)")

// Health is what the plugins ask of the telemetry store.
type Health interface {
	GPUHealth(endpoint string) (telemetry.GPUHealth, bool)
}

// Throttle groups, by their parameter names.
var throttleGroups = map[string]uint64{
	"thermal":    telemetryv1.ThrottleThermal,
	"power":      telemetryv1.ThrottlePower,
	"hwSlowdown": telemetryv1.ThrottleHWSlowdown,
}

var defaultIgnoredXIDs = []uint64{13, 31, 43, 45}

// common are both plugins' XID parameters.
type common struct {
	XIDWindow  *duration.Duration `json:"xidWindow"`
	IgnoreXIDs []uint64           `json:"ignoreXIDs"`
}

type xidRule struct {
	window time.Duration
	ignore []uint64
}

func (c common) rule() (xidRule, error) {
	r := xidRule{window: 10 * time.Minute, ignore: defaultIgnoredXIDs}
	if c.XIDWindow != nil {
		r.window = time.Duration(*c.XIDWindow)
		if r.window <= 0 {
			return r, fmt.Errorf("parameters.xidWindow %v must be positive", r.window)
		}
	}
	if c.IgnoreXIDs != nil {
		r.ignore = c.IgnoreXIDs
	}
	return r, nil
}

// recentXID reports whether h shows an XID error that counts at now.
func (r xidRule) recentXID(h telemetry.GPUHealth, now time.Time) bool {
	return h.XIDErrors > 0 && !h.LastXIDTime.IsZero() && now.Sub(h.LastXIDTime) <= r.window &&
		!slices.Contains(r.ignore, h.LastXID)
}

// FilterParams are gpu-health-filter's parameters.
type FilterParams struct {
	XIDWindow  *duration.Duration `json:"xidWindow"`
	IgnoreXIDs []uint64           `json:"ignoreXIDs"`
	Throttle   []string           `json:"throttle"`
}

// Filter implements gpu-health-filter.
//
// Parameters:
//
//	xidWindow: duration    an XID error this recent marks the GPU unhealthy (10m)
//	ignoreXIDs: list       XID codes that do not count ([13, 31, 43, 45])
//	throttle: list         throttle groups that drop the endpoint: thermal, power, hwSlowdown ([thermal])
type Filter struct {
	scheduling.Named
	health Health
	now    func() time.Time
	xid    xidRule
	drop   uint64 // throttle reasons that drop
}

func store(h *scheduling.Handle) (Health, error) {
	s, ok := telemetry.FromHandle(h)
	if !ok || s == nil {
		return nil, ErrNoTelemetry
	}
	return s, nil
}

// NewFilter is gpu-health-filter's factory.
func NewFilter(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p := FilterParams{Throttle: []string{"thermal"}}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	xr, err := common{p.XIDWindow, p.IgnoreXIDs}.rule()
	if err != nil {
		return nil, err
	}
	f := &Filter{Named: scheduling.NewNamed(FilterType, name), now: scheduling.NowOf(h), xid: xr}
	for _, g := range p.Throttle {
		bits, ok := throttleGroups[g]
		if !ok {
			return nil, fmt.Errorf("parameters.throttle: unknown group %q (thermal, power, hwSlowdown)", g)
		}
		f.drop |= bits
	}
	if f.health, err = store(h); err != nil {
		return nil, err
	}
	return f, nil
}

// Filter implements scheduling.Filter.
func (f *Filter) Filter(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	now := f.now()
	healthy := make([]bool, len(eps))
	n := 0
	for i, e := range eps {
		h, ok := f.health.GPUHealth(e.Address())
		healthy[i] = !ok || (!f.xid.recentXID(h, now) && h.ThrottleReasons&f.drop == 0)
		if healthy[i] {
			n++
		}
	}
	if n == 0 {
		return eps
	}
	kept := eps[:0]
	for i, e := range eps {
		if healthy[i] {
			kept = append(kept, e)
		}
	}
	return kept
}

// ScorerParams are gpu-health-scorer's parameters.
type ScorerParams struct {
	XIDWindow         *duration.Duration `json:"xidWindow"`
	IgnoreXIDs        []uint64           `json:"ignoreXIDs"`
	ThermalPenalty    *float64           `json:"thermalPenalty"`
	PowerPenalty      *float64           `json:"powerPenalty"`
	HWSlowdownPenalty *float64           `json:"hwSlowdownPenalty"`
}

// Scorer implements gpu-health-scorer.
//
// Parameters:
//
//	xidWindow: duration       as the filter's (10m)
//	ignoreXIDs: list          as the filter's
//	thermalPenalty: float     taken off the score while thermally throttled (0.5)
//	powerPenalty: float       while power capped or power braked (0.3)
//	hwSlowdownPenalty: float  while in hardware slowdown (0.5)
type Scorer struct {
	scheduling.Named
	health    Health
	now       func() time.Time
	xid       xidRule
	penalties [3]struct {
		bits uint64
		v    float64
	}
}

// NewScorer is gpu-health-scorer's factory.
func NewScorer(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p ScorerParams
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	xr, err := common{p.XIDWindow, p.IgnoreXIDs}.rule()
	if err != nil {
		return nil, err
	}
	s := &Scorer{Named: scheduling.NewNamed(ScorerType, name), now: scheduling.NowOf(h), xid: xr}
	for i, c := range []struct {
		name string
		bits uint64
		p    *float64
		def  float64
	}{
		{"thermalPenalty", telemetryv1.ThrottleThermal, p.ThermalPenalty, 0.5},
		{"powerPenalty", telemetryv1.ThrottlePower, p.PowerPenalty, 0.3},
		{"hwSlowdownPenalty", telemetryv1.ThrottleHWSlowdown, p.HWSlowdownPenalty, 0.5},
	} {
		v := c.def
		if c.p != nil {
			v = *c.p
		}
		if v < 0 || v > 1 {
			return nil, fmt.Errorf("parameters.%s %v must be in [0, 1]", c.name, v)
		}
		s.penalties[i].bits, s.penalties[i].v = c.bits, v
	}
	if s.health, err = store(h); err != nil {
		return nil, err
	}
	return s, nil
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	now := s.now()
	for i, e := range eps {
		h, ok := s.health.GPUHealth(e.Address())
		switch {
		case !ok:
			scores[i] = 1
		case s.xid.recentXID(h, now):
			scores[i] = 0
		default:
			v := 1.0
			for _, p := range s.penalties {
				if h.ThrottleReasons&p.bits != 0 {
					v -= p.v
				}
			}
			scores[i] = max(v, 0)
		}
	}
}

var (
	_ scheduling.Filter = (*Filter)(nil)
	_ scheduling.Scorer = (*Scorer)(nil)
)
