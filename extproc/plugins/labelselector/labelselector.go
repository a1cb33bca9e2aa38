// Package labelselector holds llm-d's generic label filters:
// label-selector-filter (alias by-label-selector, its older name) keeps the
// endpoints whose pod labels match a Kubernetes label selector
// (matchLabels, all must match, and matchExpressions with In, NotIn,
// Exists, DoesNotExist); by-label, deprecated upstream, keeps those whose
// label has one of a list of values (and, with allowsNoLabel, those
// without it). An empty selector keeps every endpoint, as in Kubernetes.
// Both deprecated names load with a deprecation log.
//
// Parameters of label-selector-filter:
//
//	matchLabels: map        {key: value} pairs, all of which must match
//	matchExpressions: list  {key, operator, values} requirements
package labelselector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registered plugin types.
const (
	Type        = "label-selector-filter"
	Alias       = "by-label-selector"
	ByLabelType = "by-label"
)

// Params are label-selector-filter's parameters: a Kubernetes
// LabelSelector.
type Params struct {
	MatchLabels      map[string]string                 `json:"matchLabels"`
	MatchExpressions []metav1.LabelSelectorRequirement `json:"matchExpressions"`
}

// Filter implements label-selector-filter.
type Filter struct {
	scheduling.Named
	selector labels.Selector
}

// NewAlias is the factory of by-label-selector, label-selector-filter's
// deprecated name.
func NewAlias(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	deprecated(h, Alias, "use "+Type)
	return New(name, raw, h)
}

func deprecated(h *scheduling.Handle, typ, instead string) {
	log := slog.Default()
	if h != nil && h.Log != nil {
		log = h.Log
	}
	log.Warn("deprecated plugin type; "+instead, "plugin", typ)
}

// New is label-selector-filter's factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	sel, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchLabels: p.MatchLabels, MatchExpressions: p.MatchExpressions})
	if err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	return &Filter{Named: scheduling.NewNamed(Type, name), selector: sel}, nil
}

// Filter implements scheduling.Filter.
func (f *Filter) Filter(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	kept := eps[:0]
	for _, e := range eps {
		if f.selector.Matches(labels.Set(e.Spec().Labels)) {
			kept = append(kept, e)
		}
	}
	return kept
}

// ByLabelParams are by-label's parameters.
type ByLabelParams struct {
	Label         string   `json:"label"`
	ValidValues   []string `json:"validValues"`
	AllowsNoLabel bool     `json:"allowsNoLabel"`
}

// ByLabel implements by-label.
//
// Parameters:
//
//	label: string        the pod label read (required)
//	validValues: list    values kept (required unless allowsNoLabel)
//	allowsNoLabel: bool  keep endpoints without the label (default false)
type ByLabel struct {
	scheduling.Named
	p ByLabelParams
}

// NewByLabel is by-label's factory.
func NewByLabel(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	deprecated(h, ByLabelType, "use "+Type+", or the role filters for llm-d.ai/role")
	var p ByLabelParams
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.Label == "" {
		return nil, errors.New("parameters.label is required")
	}
	if len(p.ValidValues) == 0 && !p.AllowsNoLabel {
		return nil, errors.New("parameters.validValues is required unless allowsNoLabel is true")
	}
	return &ByLabel{Named: scheduling.NewNamed(ByLabelType, name), p: p}, nil
}

// Filter implements scheduling.Filter.
func (f *ByLabel) Filter(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	kept := eps[:0]
	for _, e := range eps {
		v, ok := e.Spec().Labels[f.p.Label]
		if (ok && slices.Contains(f.p.ValidValues, v)) || (!ok && f.p.AllowsNoLabel) {
			kept = append(kept, e)
		}
	}
	return kept
}

var (
	_ scheduling.Filter = (*Filter)(nil)
	_ scheduling.Filter = (*ByLabel)(nil)
)
