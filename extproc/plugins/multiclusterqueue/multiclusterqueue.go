// Package multiclusterqueue is llm-d's multicluster-queue-scorer:
// queue-scorer for a picker whose endpoints are peer clusters. Among the
// clusters with a QueueSize attribute (the pool's average waiting queue,
// which multicluster-metrics-extractor reads from the cluster's picker),
// the shortest queue scores 1, the longest 0, the rest in between, and all
// 1 when equal; a cluster without the attribute scores 0. A configuration
// without a multicluster-metrics-extractor is refused.
//
// Parameters: none.
package multiclusterqueue

import (
	"context"
	"encoding/json"
	"math"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "multicluster-queue-scorer"

// Scorer implements multicluster-queue-scorer.
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
	lo, hi := math.Inf(1), math.Inf(-1)
	vals := make([]float64, len(eps))
	has := make([]bool, len(eps))
	for i, e := range eps {
		vals[i], has[i] = s.x.Attribute(multiclustermetrics.QueueSize, e)
		if has[i] {
			lo, hi = min(lo, vals[i]), max(hi, vals[i])
		}
	}
	for i := range eps {
		switch {
		case !has[i]:
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
