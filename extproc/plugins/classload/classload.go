package classload

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "class-load-scorer"

// The values of the apply parameter.
const (
	ApplyBoth      = "both"
	ApplySheddable = "sheddable"
	ApplyProtected = "protected"
)

// Params are the plugin's parameters.
type Params struct {
	Apply            string   `json:"apply"`
	SameClassWeight  *float64 `json:"sameClassWeight"`
	OtherClassWeight *float64 `json:"otherClassWeight"`
}

// Scorer implements class-load-scorer. The counts are the datastore's
// (endpoints.Endpoint.InflightByClass: charged at the decision, moved with
// a fallback, released at the response's end); the scorer only remembers
// which endpoints it placed requests on, for Totals.
type Scorer struct {
	scheduling.Named
	scoreSheddable, scoreProtected bool
	same, other                    float64

	mu     sync.RWMutex
	placed map[string]*endpoints.Endpoint
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{Apply: ApplyBoth}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	s := &Scorer{Named: scheduling.NewNamed(Type, name), same: 1, placed: map[string]*endpoints.Endpoint{}}
	switch p.Apply {
	case ApplyBoth:
		s.scoreSheddable, s.scoreProtected = true, true
	case ApplySheddable:
		s.scoreSheddable = true
	case ApplyProtected:
		s.scoreProtected = true
	default:
		return nil, fmt.Errorf("parameters.apply must be %q, %q or %q, got %q", ApplyBoth, ApplySheddable, ApplyProtected, p.Apply)
	}
	for _, w := range []struct {
		name string
		v    *float64
		dst  *float64
	}{{"sameClassWeight", p.SameClassWeight, &s.same}, {"otherClassWeight", p.OtherClassWeight, &s.other}} {
		if w.v == nil {
			continue
		}
		if math.IsNaN(*w.v) || *w.v < 0 || *w.v > 1 {
			return nil, fmt.Errorf("parameters.%s must be in [0, 1], got %v", w.name, *w.v)
		}
		*w.dst = *w.v
	}
	if s.same == 0 && s.other == 0 {
		return nil, fmt.Errorf("parameters.sameClassWeight and otherClassWeight are both 0: the scorer would rank nothing")
	}
	return s, nil
}

func sheddable(req *scheduling.Request) bool { return flowcontrol.Sheddable(req.Priority) }

// Totals is the requests in flight by class over every endpoint the plugin
// has placed requests on (presence-holdback-policy reads it), and how many
// those are.
func (s *Scorer) Totals() (protected, sheddable int64, endpoints int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, e := range s.placed {
		p, n := e.InflightByClass()
		protected += p
		sheddable += n
	}
	return protected, sheddable, len(s.placed)
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	shed := sheddable(req)
	if shed && !s.scoreSheddable || !shed && !s.scoreProtected {
		return
	}
	scheduling.InverseMinMax(eps, scores, func(e *endpoints.Endpoint) float64 {
		p, n := e.InflightByClass()
		own, other := p, n
		if shed {
			own, other = n, p
		}
		return s.same*float64(own) + s.other*float64(other)
	})
}

// PreRequest implements scheduling.PreRequest: Totals counts the primary
// target from now on (the director has charged the request to it).
func (s *Scorer) PreRequest(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Result) {
	p := res.Primary()
	if p == nil || len(p.Targets) == 0 {
		return
	}
	e := p.Targets[0]
	s.mu.RLock()
	known := s.placed[e.Address()] == e
	s.mu.RUnlock()
	if !known {
		s.mu.Lock()
		s.placed[e.Address()] = e
		s.mu.Unlock()
	}
}

// EndpointsRemoved implements scheduling.EndpointsRemoved.
func (s *Scorer) EndpointsRemoved(addresses []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range addresses {
		delete(s.placed, a)
	}
}

var (
	_ scheduling.Scorer           = (*Scorer)(nil)
	_ scheduling.PreRequest       = (*Scorer)(nil)
	_ scheduling.EndpointsRemoved = (*Scorer)(nil)
)
