package classload

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/extproc/endpoints"
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

// Scorer implements class-load-scorer.
type Scorer struct {
	scheduling.Named
	scoreSheddable, scoreProtected bool
	same, other                    float64
	// charged is the account PreRequest counted a request in, for
	// ResponseComplete to release; one key per instance, as every
	// instance keeps its own accounts.
	charged scheduling.Key[*account]

	mu        sync.RWMutex
	byAddress map[string]*account
}

// account is one endpoint's in-flight requests by class.
type account struct {
	protected, sheddable atomic.Int64
}

func (a *account) of(sheddable bool) *atomic.Int64 {
	if sheddable {
		return &a.sheddable
	}
	return &a.protected
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{Apply: ApplyBoth}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	s := &Scorer{Named: scheduling.NewNamed(Type, name), same: 1, byAddress: map[string]*account{}}
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
	s.charged = scheduling.NewKey[*account](s.TypedName().String())
	return s, nil
}

func sheddable(req *scheduling.Request) bool { return req.Priority < 0 }

// InFlight is what the plugin counts on the endpoint at address now.
func (s *Scorer) InFlight(address string) (protected, sheddable int64) {
	s.mu.RLock()
	a := s.byAddress[address]
	s.mu.RUnlock()
	if a == nil {
		return 0, 0
	}
	return a.protected.Load(), a.sheddable.Load()
}

// Totals is what the plugin counts over every endpoint it has placed
// requests on (presence-holdback-policy reads it), and how many those are.
func (s *Scorer) Totals() (protected, sheddable int64, endpoints int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, a := range s.byAddress {
		protected += a.protected.Load()
		sheddable += a.sheddable.Load()
	}
	return protected, sheddable, len(s.byAddress)
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	shed := sheddable(req)
	if shed && !s.scoreSheddable || !shed && !s.scoreProtected {
		return
	}
	scheduling.InverseMinMax(eps, scores, func(e *endpoints.Endpoint) float64 {
		p, n := s.InFlight(e.Address())
		own, other := p, n
		if shed {
			own, other = n, p
		}
		return s.same*float64(own) + s.other*float64(other)
	})
}

// PreRequest implements scheduling.PreRequest: the request is in flight on
// its primary target.
func (s *Scorer) PreRequest(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, res *scheduling.Result) {
	p := res.Primary()
	if p == nil || len(p.Targets) == 0 {
		return
	}
	addr := p.Targets[0].Address()
	s.mu.RLock()
	a := s.byAddress[addr]
	s.mu.RUnlock()
	if a == nil {
		s.mu.Lock()
		if a = s.byAddress[addr]; a == nil {
			a = &account{}
			s.byAddress[addr] = a
		}
		s.mu.Unlock()
	}
	a.of(sheddable(req)).Add(1)
	scheduling.Write(cs, s.charged, a)
}

// ResponseComplete implements scheduling.ResponseComplete: the request
// PreRequest counted is no longer in flight.
func (s *Scorer) ResponseComplete(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, _ *scheduling.Response) {
	if a, ok := scheduling.Read(cs, s.charged); ok && a != nil {
		a.of(sheddable(req)).Add(-1)
		scheduling.Write(cs, s.charged, nil)
	}
}

// EndpointsRemoved implements scheduling.EndpointsRemoved.
func (s *Scorer) EndpointsRemoved(addresses []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range addresses {
		delete(s.byAddress, a)
	}
}

var (
	_ scheduling.Scorer           = (*Scorer)(nil)
	_ scheduling.PreRequest       = (*Scorer)(nil)
	_ scheduling.ResponseComplete = (*Scorer)(nil)
	_ scheduling.EndpointsRemoved = (*Scorer)(nil)
)
