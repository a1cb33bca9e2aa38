// Package multiclusterscore holds llm-d's two multi-cluster metric
// scorers, kv-cache-utilization-scorer and queue-scorer for a picker whose
// endpoints are peer clusters. Both read the attributes that
// multicluster-metrics-extractor keeps from each cluster's picker (see
// extproc/plugins/multiclustermetrics); a configuration without that
// extractor is refused, as in llm-d, and a cluster without the attribute
// scores 0.
//
// multicluster-kv-cache-utilization-scorer scores a cluster 1 - its
// pool's average KV-cache utilization (clamped to [0, 1]).
//
// multicluster-queue-scorer ranks the clusters with a queue size: the
// shortest average waiting queue scores 1, the longest 0, the rest in
// between, all 1 when equal.
//
// Parameters: none.
package multiclusterscore

import (
	"context"
	"encoding/json"
	"math"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registered plugin types.
const (
	KVCacheType = "multicluster-kv-cache-utilization-scorer"
	QueueType   = "multicluster-queue-scorer"
)

// Scorer implements both types.
type Scorer struct {
	scheduling.Named
	attr string
	x    *multiclustermetrics.Extractor
}

// NewKVCache is multicluster-kv-cache-utilization-scorer's factory.
func NewKVCache(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	return newScorer(KVCacheType, multiclustermetrics.KVCacheUtilization, name, params)
}

// NewQueue is multicluster-queue-scorer's factory.
func NewQueue(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	return newScorer(QueueType, multiclustermetrics.QueueSize, name, params)
}

func newScorer(typ, attr, name string, params json.RawMessage) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(typ, name, params)
	if err != nil {
		return nil, err
	}
	return &Scorer{Named: n, attr: attr}, nil
}

// ResolvePlugins implements scheduling.PluginSetResolver.
func (s *Scorer) ResolvePlugins(all []scheduling.Plugin) (err error) {
	s.x, err = multiclustermetrics.Find(all)
	return err
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	vals := make([]float64, len(eps))
	has := make([]bool, len(eps))
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, e := range eps {
		vals[i], has[i] = s.x.Attribute(s.attr, e)
		if has[i] {
			lo, hi = min(lo, vals[i]), max(hi, vals[i])
		}
	}
	for i := range eps {
		switch {
		case !has[i]:
		case s.attr == multiclustermetrics.KVCacheUtilization:
			scores[i] = min(max(1-vals[i], 0), 1)
		case hi == lo:
			scores[i] = 1
		default:
			scores[i] = (hi - vals[i]) / (hi - lo)
		}
	}
}

var (
	_ scheduling.Scorer            = (*Scorer)(nil)
	_ scheduling.PluginSetResolver = (*Scorer)(nil)
)
