// Package runningrequests is the running-requests-scorer (alias llm-d's
// active-request-scorer): endpoints with fewer requests in flight score
// higher, min-max normalised across the candidates.
//
// It counts the requests the picker itself has routed and not yet seen
// finish, not the server's scraped running count: the picker's own count is
// current at every decision, while a scrape can be tens of milliseconds old,
// long enough for a burst to pile onto one endpoint.
//
// Parameters: none.
package runningrequests

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type; Alias is llm-d's name for it.
const (
	Type  = "running-requests-scorer"
	Alias = "active-request-scorer"
)

// Scorer implements running-requests-scorer.
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
	scheduling.InverseMinMax(eps, scores, inflight)
}

func inflight(e *endpoints.Endpoint) float64 { return float64(e.InflightRequests()) }
