// Package queue is the queue-scorer: endpoints with fewer waiting requests
// score higher, min-max normalised across the candidates, as in GIE.
//
// Parameters: none.
package queue

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "queue-scorer"

// Scorer implements queue-scorer.
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
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	scheduling.InverseMinMax(eps, scores, waiting)
}

func waiting(e *endpoints.Endpoint) float64 { return float64(e.Metrics().WaitingQueueSize) }
