// Package tokenload is the token-load-scorer: 1 − min(1, tokens/capacity),
// where tokens is the prompt plus expected output tokens of the requests the
// picker has routed to the endpoint and not yet seen finish.
//
// Parameters:
//
//	capacityTokens: int  tokens at which an endpoint scores 0 (default 4194304)
package tokenload

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "token-load-scorer"

// DefaultCapacityTokens is GIE's saturation point.
const DefaultCapacityTokens = 4_194_304

// Params are the plugin's parameters.
type Params struct {
	CapacityTokens int64 `json:"capacityTokens"`
}

// Scorer implements token-load-scorer.
type Scorer struct {
	scheduling.Named
	capacity float64
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{CapacityTokens: DefaultCapacityTokens}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.CapacityTokens <= 0 {
		return nil, fmt.Errorf("parameters.capacityTokens must be positive, got %d", p.CapacityTokens)
	}
	return &Scorer{Named: scheduling.NewNamed(Type, name), capacity: float64(p.CapacityTokens)}, nil
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	for i, e := range eps {
		scores[i] = 1 - min(1, float64(e.InflightTokens())/s.capacity)
	}
}
