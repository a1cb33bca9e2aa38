// Package loadaware is llm-d's load-aware-scorer: an endpoint with an empty
// waiting queue scores 0.5; otherwise 0.5 × (1 − min(q, threshold)/threshold),
// so any queueing ranks below an idle queue and a queue at the threshold
// scores 0.
//
// Parameters:
//
//	threshold: int  queue length that scores 0 (default 128)
package loadaware

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "load-aware-scorer"

// DefaultThreshold is llm-d's default queue threshold.
const DefaultThreshold = 128

// Params are the plugin's parameters.
type Params struct {
	Threshold int `json:"threshold"`
}

// Scorer implements load-aware-scorer.
type Scorer struct {
	scheduling.Named
	threshold float64
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{Threshold: DefaultThreshold}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.Threshold <= 0 {
		return nil, fmt.Errorf("parameters.threshold must be positive, got %d", p.Threshold)
	}
	return &Scorer{Named: scheduling.NewNamed(Type, name), threshold: float64(p.Threshold)}, nil
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	for i, e := range eps {
		q := float64(e.Metrics().WaitingQueueSize)
		if q <= 0 {
			scores[i] = 0.5
			continue
		}
		scores[i] = 0.5 * (1 - min(q, s.threshold)/s.threshold)
	}
}
