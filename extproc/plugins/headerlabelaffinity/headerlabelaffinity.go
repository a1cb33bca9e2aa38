// Package headerlabelaffinity is llm-d's header-label-affinity-scorer: a
// soft preference for the endpoints whose label labelKey equals the
// request's header headerName. A match scores 1, everything else 0 and
// stays eligible (no header, an empty one, or an endpoint without the
// label). One instance per header-to-label mapping, so that each has its
// profile weight; with disaggregatedset-rollout-screener it prefers the
// DisaggregatedSet slice a prefill went to.
//
// Parameters:
//
//	headerName: string  the request header holding the preferred value (required; any case)
//	labelKey: string    the endpoint label compared with it (required)
package headerlabelaffinity

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "header-label-affinity-scorer"

// Params are the plugin's parameters.
type Params struct {
	HeaderName string `json:"headerName"`
	LabelKey   string `json:"labelKey"`
}

// Scorer implements header-label-affinity-scorer.
type Scorer struct {
	scheduling.Named
	header, label string
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.HeaderName == "" {
		return nil, errors.New("parameters.headerName is required")
	}
	if p.LabelKey == "" {
		return nil, errors.New("parameters.labelKey is required")
	}
	return &Scorer{Named: scheduling.NewNamed(Type, name), header: strings.ToLower(p.HeaderName), label: p.LabelKey}, nil
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	want := ""
	if req != nil {
		want = req.Headers[s.header]
	}
	for i, e := range eps {
		scores[i] = 0
		if want != "" && e.Label(s.label) == want {
			scores[i] = 1
		}
	}
}
