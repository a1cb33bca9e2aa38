// Package probadmitter is llm-d's probabilistic-admitter: it sheds
// sheddable requests (priority below zero) with a probability that rises
// steeply with the pool's saturation, and always admits the others.
//
// Saturation is the mean over the candidates of
// max(waiting queue / queueDepthThreshold, KV-cache use / kvCacheUtilThreshold),
// a never-scraped candidate counting as 1; a sheddable request is refused
// with probability min(saturation^power × k, 1). With the defaults nothing
// is shed below saturation 0.08, about 2% at 0.15 and everything from
// (1/k)^(1/power) ≈ 0.34. A refusal is answered 429 (ResourceExhausted,
// dropped reason rejected-saturated) like every admitter's.
//
// Parameters (each must be positive):
//
//	queueDepthThreshold: int      waiting requests at which an endpoint counts as saturated (default 5)
//	kvCacheUtilThreshold: float  KV-cache use, 0..1, at which it does (default 0.8)
//	power: float                 the curve's steepness (default 5)
//	k: float                     its scale: everything is shed from (1/k)^(1/power) (default 300)
package probadmitter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "probabilistic-admitter"

// ErrShed is the refusal.
var ErrShed = errors.New("sheddable request shed by the probabilistic admitter")

// Params are the plugin's parameters.
type Params struct {
	QueueDepthThreshold  int     `json:"queueDepthThreshold"`
	KVCacheUtilThreshold float64 `json:"kvCacheUtilThreshold"`
	Power                float64 `json:"power"`
	K                    float64 `json:"k"`
}

// Defaults are llm-d's.
func Defaults() Params {
	return Params{QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8, Power: 5, K: 300}
}

// Admitter implements probabilistic-admitter.
type Admitter struct {
	scheduling.Named
	p    Params
	rand scheduling.Rand
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p := Defaults()
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	switch {
	case p.QueueDepthThreshold <= 0:
		return nil, fmt.Errorf("parameters.queueDepthThreshold must be positive, got %d", p.QueueDepthThreshold)
	case !(p.KVCacheUtilThreshold > 0):
		return nil, fmt.Errorf("parameters.kvCacheUtilThreshold must be positive, got %v", p.KVCacheUtilThreshold)
	case !(p.Power > 0) || math.IsInf(p.Power, 0):
		return nil, fmt.Errorf("parameters.power must be positive, got %v", p.Power)
	case !(p.K > 0) || math.IsInf(p.K, 0):
		return nil, fmt.Errorf("parameters.k must be positive, got %v", p.K)
	}
	return &Admitter{Named: scheduling.NewNamed(Type, name), p: p, rand: scheduling.RandOf(h)}, nil
}

// MeanSaturation is the candidates' mean saturation (see the package
// comment). It is not called Saturation: that would make the admitter a
// flowcontrol.SaturationDetector, which llm-d does not accept it as, and
// the configuration would let it gate dispatch.
func (a *Admitter) MeanSaturation(eps []*endpoints.Endpoint) float64 {
	if len(eps) == 0 {
		return 0
	}
	total := 0.0
	for _, e := range eps {
		m := e.Metrics()
		if m.UpdateTime.IsZero() {
			total++
			continue
		}
		total += max(float64(m.WaitingQueueSize)/float64(a.p.QueueDepthThreshold), m.KVCacheUsage/a.p.KVCacheUtilThreshold)
	}
	return total / float64(len(eps))
}

// ShedProbability is the chance a sheddable request is refused at
// saturation sat.
func (a *Admitter) ShedProbability(sat float64) float64 {
	return math.Min(math.Pow(sat, a.p.Power)*a.p.K, 1)
}

// Admit implements scheduling.Admitter.
func (a *Admitter) Admit(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) error {
	if req == nil || !flowcontrol.Sheddable(req.Priority) || len(eps) == 0 {
		return nil
	}
	sat := a.MeanSaturation(eps)
	prob := a.ShedProbability(sat)
	if a.rand.Float64() < prob {
		return fmt.Errorf("%w (saturation %.3f, probability %.2f)", ErrShed, sat, prob)
	}
	return nil
}

var _ scheduling.Admitter = (*Admitter)(nil)
