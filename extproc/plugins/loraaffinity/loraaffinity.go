// Package loraaffinity is the lora-affinity-scorer: prefer endpoints where
// the request's adapter (its target model) is already loaded (1.0), then
// those where it is waiting to load (0.6 — loading is under way but the
// adapter slot is contended) or that have a free adapter slot (0.8), and
// never those that would have to evict (0).
//
// Parameters: none.
package loraaffinity

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "lora-affinity-scorer"

// Scores, as in GIE.
const (
	ScoreActive  = 1.0
	ScoreRoom    = 0.8
	ScoreWaiting = 0.6
)

// Scorer implements lora-affinity-scorer.
type Scorer struct{ scheduling.Named }

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Scorer{n}, nil
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	for i, e := range eps {
		scores[i] = affinity(e.Metrics(), req.TargetModel)
	}
}

func affinity(m *endpoints.Metrics, adapter string) float64 {
	if _, ok := m.ActiveLoRAs[adapter]; ok {
		return ScoreActive
	}
	if _, ok := m.WaitingLoRAs[adapter]; ok {
		return ScoreWaiting
	}
	if len(m.ActiveLoRAs)+len(m.WaitingLoRAs) < m.MaxLoRAs {
		return ScoreRoom
	}
	return 0
}
