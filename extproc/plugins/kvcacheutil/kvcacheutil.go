// Package kvcacheutil is the kv-cache-utilization-scorer: 1 − the endpoint's
// KV-cache usage fraction, so that emptier caches win.
//
// Parameters: none.
package kvcacheutil

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "kv-cache-utilization-scorer"

// Scorer implements kv-cache-utilization-scorer.
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
	for i, e := range eps {
		scores[i] = 1 - e.Metrics().KVCacheUsage
	}
}
