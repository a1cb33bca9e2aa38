// Package sloheadroom is the slo-headroom-tier-filter: for a request with a
// latency SLO it splits the candidates into those whose cautious (quantile)
// prediction meets the SLO and those that miss it, and keeps the first tier
// — or, with probability epsilonExploreNeg, the second, so that the
// predictor keeps learning how the busier endpoints behave. When no
// candidate meets the SLO every candidate is kept (the latency scorer then
// prefers the least negative headroom); a request without an SLO, or
// without predictions, passes unfiltered.
//
// Parameters (llm-d's):
//
//	epsilonExploreNeg: float   default 0.01
package sloheadroom

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "slo-headroom-tier-filter"

// Params are the plugin's parameters.
type Params struct {
	EpsilonExploreNeg float64 `json:"epsilonExploreNeg"`
}

// Filter implements slo-headroom-tier-filter.
type Filter struct {
	scheduling.Named
	explore float64
	rand    scheduling.Rand
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{EpsilonExploreNeg: 0.01}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.EpsilonExploreNeg < 0 || p.EpsilonExploreNeg > 1 {
		return nil, fmt.Errorf("parameters.epsilonExploreNeg must be in [0, 1], got %v", p.EpsilonExploreNeg)
	}
	return &Filter{Named: scheduling.NewNamed(Type, name), explore: p.EpsilonExploreNeg, rand: scheduling.RandOf(h)}, nil
}

// Filter implements scheduling.Filter.
func (f *Filter) Filter(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	slo := latency.SLOOf(req)
	preds, ok := scheduling.Read(cs, latency.PredictionsKey)
	if !slo.Set() || !ok {
		return eps
	}
	var meet, miss []*endpoints.Endpoint
	preds.Align(eps, func(i, k int) {
		if _, ok := preds.Headroom(k, slo, 1, 1); ok {
			meet = append(meet, eps[i])
		} else {
			miss = append(miss, eps[i])
		}
	})
	switch {
	case len(meet) == 0:
		return eps
	case len(miss) > 0 && f.explore > 0 && f.rand.Float64() < f.explore:
		return miss
	}
	return meet
}

var _ scheduling.Filter = (*Filter)(nil)
