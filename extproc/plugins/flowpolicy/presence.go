package flowpolicy

import (
	"encoding/json"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// PresenceType is the registered type of kvgate's own usage-limit policy
// that holds sheddable traffic back by the protected traffic in flight.
const PresenceType = "presence-holdback-policy"

// ClassCounter is what presence-holdback-policy reads: the requests in
// flight by class over the endpoints the counter knows
// (class-load-scorer implements it).
type ClassCounter interface {
	Totals() (protected, sheddable int64, endpoints int)
}

// Presence is presence-holdback-policy (kvgate's own; llm-d has no
// usage-limit policy that looks at the traffic's class): the bands of
// priority ≥ 0 are never held below saturation; the sheddable bands
// (priority < 0) dispatch while saturation is below
//
//	max(minCeiling, ceiling − perProtected × protected requests in flight per endpoint)
//
// so the batch ceiling shrinks while online requests run and grows back as
// they leave: batch fills the fleet while online is light and gives way,
// beyond what online's own load already takes from a saturation budget,
// while online is heavy. The in-flight counts are the datastore's live
// load split by class (charged at dispatch, moved with a fallback,
// released at the end of the response), summed by a class-load-scorer
// (the plugin classLoadPluginRef names) over the endpoints it has placed
// requests on, which the mean is over. The ceiling is read at every
// dispatch pass; the picker wakes the pass only after a response's charge
// is released, so the pass sees that response gone.
//
// Measured on the mixed bench (benchmarks/RESULTS.md, "A batch budget that
// follows online presence"), it did not beat a static token budget: batch
// decodes outlive the online lulls they are admitted in.
//
// Parameters:
//
//	classLoadPluginRef: string  the class-load-scorer whose counts it reads (required)
//	ceiling: float  the sheddable bands' ceiling with no protected request in flight, in (0, 1] (required)
//	perProtected: float  what each protected request in flight per endpoint takes from it, ≥ 0 (required)
//	minCeiling: float  the floor, in [0, ceiling] (default 0)
type Presence struct {
	scheduling.Named
	ref                          string
	ceiling, perProtected, floor float64
	counter                      atomic.Pointer[ClassCounter]
}

// PresenceParams are presence-holdback-policy's parameters.
type PresenceParams struct {
	ClassLoadPluginRef string   `json:"classLoadPluginRef"`
	Ceiling            *float64 `json:"ceiling"`
	PerProtected       *float64 `json:"perProtected"`
	MinCeiling         *float64 `json:"minCeiling"`
}

// NewPresence is the plugin factory.
func NewPresence(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p PresenceParams
	if err := scheduling.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	switch {
	case p.ClassLoadPluginRef == "":
		return nil, fmt.Errorf("parameters.classLoadPluginRef is required")
	case p.Ceiling == nil:
		return nil, fmt.Errorf("parameters.ceiling is required")
	case p.PerProtected == nil:
		return nil, fmt.Errorf("parameters.perProtected is required")
	}
	s := &Presence{Named: scheduling.NewNamed(PresenceType, name), ref: p.ClassLoadPluginRef,
		ceiling: *p.Ceiling, perProtected: *p.PerProtected}
	if p.MinCeiling != nil {
		s.floor = *p.MinCeiling
	}
	switch {
	case !(s.ceiling > 0 && s.ceiling <= 1):
		return nil, fmt.Errorf("parameters.ceiling must be in (0, 1], got %v", s.ceiling)
	case !(s.perProtected >= 0) || math.IsInf(s.perProtected, 0):
		return nil, fmt.Errorf("parameters.perProtected must be a finite number ≥ 0, got %v", s.perProtected)
	case !(s.floor >= 0 && s.floor <= s.ceiling):
		return nil, fmt.Errorf("parameters.minCeiling must be in [0, ceiling %v], got %v", s.ceiling, s.floor)
	}
	return s, nil
}

// Resolve implements scheduling.Resolver.
func (s *Presence) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	c, err := scheduling.LookupAs[ClassCounter](lookup, "classLoadPluginRef", s.ref, "a class-load-scorer")
	if err != nil {
		return err
	}
	s.counter.Store(&c)
	return nil
}

// Ceiling is the sheddable bands' ceiling now.
func (s *Presence) Ceiling() float64 {
	var protected int64
	n := 0
	if c := s.counter.Load(); c != nil {
		protected, _, n = (*c).Totals()
	}
	if n == 0 || protected <= 0 {
		return s.ceiling
	}
	return max(s.floor, s.ceiling-s.perProtected*float64(protected)/float64(n))
}

// Ceilings implements flowcontrol.UsageLimitPolicy.
func (s *Presence) Ceilings(_ float64, priorities []int, ceilings []float64) {
	c := -1.0
	for i, p := range priorities {
		if !flowcontrol.Sheddable(p) {
			continue
		}
		if c < 0 {
			c = s.Ceiling()
		}
		ceilings[i] = c
	}
}

var (
	_ flowcontrol.UsageLimitPolicy = (*Presence)(nil)
	_ scheduling.Resolver          = (*Presence)(nil)
)
