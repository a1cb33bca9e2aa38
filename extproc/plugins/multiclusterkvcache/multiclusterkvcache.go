// Package multiclusterkvcache is llm-d's
// multicluster-kv-cache-utilization-scorer: kv-cache-utilization-scorer
// for a picker whose endpoints are peer clusters. A cluster scores
// 1 - its pool's average KV-cache utilization, the KVCacheUtilization
// attribute that multicluster-metrics-extractor reads from the cluster's
// picker; a cluster without the attribute scores 0. A configuration
// without a multicluster-metrics-extractor is refused.
//
// Parameters: none.
package multiclusterkvcache

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "multicluster-kv-cache-utilization-scorer"

// Scorer implements multicluster-kv-cache-utilization-scorer.
type Scorer struct {
	scheduling.Named
	x *multiclustermetrics.Extractor
}

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Scorer{Named: n}, nil
}

// ResolvePlugins implements scheduling.PluginSetResolver.
func (s *Scorer) ResolvePlugins(all []scheduling.Plugin) (err error) {
	s.x, err = multiclustermetrics.Find(all)
	return err
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	for i, e := range eps {
		if u, ok := s.x.Attribute(multiclustermetrics.KVCacheUtilization, e); ok {
			scores[i] = min(max(1-u, 0), 1)
		}
	}
}

var (
	_ scheduling.Scorer            = (*Scorer)(nil)
	_ scheduling.PluginSetResolver = (*Scorer)(nil)
)
