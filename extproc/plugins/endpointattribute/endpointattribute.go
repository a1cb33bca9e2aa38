package endpointattribute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registered plugin types.
const (
	FilterType = "endpoint-attribute-filter"
	ScorerType = "endpoint-attribute-scorer"
)

// Producer publishes numeric attributes per endpoint (dcgm-extractor).
type Producer interface {
	scheduling.Plugin
	// Attributes are the names it publishes.
	Attributes() []string
	// Attribute is e's value of name; false when e has none.
	Attribute(name string, e *endpoints.Endpoint) (float64, bool)
}

// attribute is one configured attribute and the producer publishing it.
type attribute struct {
	name, producerName string
	producer           Producer
}

func newAttribute(param, name string, producer *string) (attribute, error) {
	switch {
	case name == "":
		return attribute{}, fmt.Errorf("parameters.%s is required", param)
	case producer == nil || *producer == "":
		return attribute{}, &scheduling.UnsupportedParameterError{Param: "producer",
			Reason: "unset or empty, it reads the core metrics extractor's custom metrics (or a producer-agnostic attribute), which kvgate does not publish; name the extractor, e.g. dcgm-extractor"}
	}
	return attribute{name: name, producerName: *producer}, nil
}

func (a *attribute) resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	pr, err := scheduling.LookupAs[Producer](lookup, "producer", a.producerName, "a producer of endpoint attributes")
	if err != nil {
		return err
	}
	if !slices.Contains(pr.Attributes(), a.name) {
		return fmt.Errorf("parameters: %q publishes %v, not %q", a.producerName, pr.Attributes(), a.name)
	}
	a.producer = pr
	return nil
}

// Threshold operators.
var operators = map[string]func(v, t float64) bool{
	"LessThan":           func(v, t float64) bool { return v < t },
	"LessThanOrEqual":    func(v, t float64) bool { return v <= t },
	"GreaterThan":        func(v, t float64) bool { return v > t },
	"GreaterThanOrEqual": func(v, t float64) bool { return v >= t },
	"Equal":              func(v, t float64) bool { return v == t },
	"NotEqual":           func(v, t float64) bool { return v != t },
}

// FilterParams are endpoint-attribute-filter's parameters.
type FilterParams struct {
	Attribute       string  `json:"attribute"`
	Producer        *string `json:"producer"`
	OnMissing       string  `json:"onMissing"`
	FallbackOnEmpty bool    `json:"fallbackOnEmpty"`
	Algorithm       struct {
		Type      string `json:"type"`
		Threshold *struct {
			Operator string  `json:"operator"`
			Value    float64 `json:"value"`
		} `json:"threshold"`
	} `json:"algorithm"`
}

// Filter implements endpoint-attribute-filter.
//
// Parameters (llm-d's):
//
//	attribute: string        the attribute (required), e.g. GPUUtilization
//	producer: string         the configured plugin publishing it (required
//	                         in kvgate), e.g. dcgm-extractor
//	onMissing: string        Pass (default: keep an endpoint without the
//	                         attribute) or Fail (drop it)
//	fallbackOnEmpty: bool    keep every candidate when all would be
//	                         dropped (default false)
//	algorithm: object        type threshold (the only one), threshold
//	                         {operator LessThan, LessThanOrEqual,
//	                         GreaterThan, GreaterThanOrEqual, Equal or
//	                         NotEqual, value}: an endpoint is kept when its
//	                         value <operator> value
type Filter struct {
	scheduling.Named
	attr            attribute
	passOnMissing   bool
	fallbackOnEmpty bool
	op              func(v, t float64) bool
	threshold       float64
}

// NewFilter is endpoint-attribute-filter's factory.
func NewFilter(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p FilterParams
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	attr, err := newAttribute("attribute", p.Attribute, p.Producer)
	if err != nil {
		return nil, err
	}
	f := &Filter{Named: scheduling.NewNamed(FilterType, name), attr: attr, fallbackOnEmpty: p.FallbackOnEmpty}
	switch p.OnMissing {
	case "", "Pass":
		f.passOnMissing = true
	case "Fail":
	default:
		return nil, fmt.Errorf("parameters.onMissing: want Pass or Fail, got %q", p.OnMissing)
	}
	if p.Algorithm.Type != "threshold" {
		return nil, fmt.Errorf("parameters.algorithm.type: want threshold (the only algorithm), got %q", p.Algorithm.Type)
	}
	th := p.Algorithm.Threshold
	if th == nil {
		return nil, errors.New("parameters.algorithm.threshold is required")
	}
	if f.op = operators[th.Operator]; f.op == nil {
		return nil, fmt.Errorf("parameters.algorithm.threshold.operator: %q is none of LessThan, LessThanOrEqual, GreaterThan, GreaterThanOrEqual, Equal, NotEqual", th.Operator)
	}
	f.threshold = th.Value
	return f, nil
}

// Resolve implements scheduling.Resolver.
func (f *Filter) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	return f.attr.resolve(lookup)
}

// Filter implements scheduling.Filter.
func (f *Filter) Filter(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	kept := make([]*endpoints.Endpoint, 0, len(eps))
	for _, e := range eps {
		v, ok := f.attr.producer.Attribute(f.attr.name, e)
		if (!ok && f.passOnMissing) || (ok && f.op(v, f.threshold)) {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 && f.fallbackOnEmpty {
		return eps
	}
	return kept
}

// ScorerParams are endpoint-attribute-scorer's parameters.
type ScorerParams struct {
	AttributeKey string  `json:"attributeKey"`
	Producer     *string `json:"producer"`
	Algorithm    struct {
		Type          string `json:"type"`
		Normalization *struct {
			AdaptiveRange *struct{} `json:"adaptiveRange"`
			FixedRange    *struct {
				Min float64 `json:"min"`
				Max float64 `json:"max"`
			} `json:"fixedRange"`
		} `json:"normalization"`
	} `json:"algorithm"`
}

// Scorer implements endpoint-attribute-scorer.
//
// Parameters (llm-d's):
//
//	attributeKey: string  the attribute (required), e.g. GPUUtilization
//	producer: string      the configured plugin publishing it (required
//	                      in kvgate), e.g. dcgm-extractor
//	algorithm: object     type linear_lower_is_better or
//	                      linear_higher_is_better; normalization: at most
//	                      one of adaptiveRange (default: the candidates'
//	                      own range; all equal score 1) and fixedRange
//	                      {min, max} (values clamped); an endpoint
//	                      without the attribute scores 0
type Scorer struct {
	scheduling.Named
	attr        attribute
	lowerBetter bool
	fixed       bool
	lo, hi      float64
}

// NewScorer is endpoint-attribute-scorer's factory.
func NewScorer(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p ScorerParams
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	attr, err := newAttribute("attributeKey", p.AttributeKey, p.Producer)
	if err != nil {
		return nil, err
	}
	s := &Scorer{Named: scheduling.NewNamed(ScorerType, name), attr: attr}
	switch p.Algorithm.Type {
	case "linear_lower_is_better":
		s.lowerBetter = true
	case "linear_higher_is_better":
	default:
		return nil, fmt.Errorf("parameters.algorithm.type: want linear_lower_is_better or linear_higher_is_better, got %q", p.Algorithm.Type)
	}
	if n := p.Algorithm.Normalization; n != nil {
		switch {
		case n.AdaptiveRange != nil && n.FixedRange != nil:
			return nil, errors.New("parameters.algorithm.normalization: give one of adaptiveRange and fixedRange")
		case n.FixedRange != nil:
			s.fixed, s.lo, s.hi = true, n.FixedRange.Min, n.FixedRange.Max
			if !(s.lo < s.hi) {
				return nil, fmt.Errorf("parameters.algorithm.normalization.fixedRange: min %v must be less than max %v", s.lo, s.hi)
			}
		}
	}
	return s, nil
}

// Resolve implements scheduling.Resolver.
func (s *Scorer) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	return s.attr.resolve(lookup)
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	vals := make([]float64, len(eps))
	has := make([]bool, len(eps))
	lo, hi := s.lo, s.hi
	if !s.fixed {
		lo, hi = math.Inf(1), math.Inf(-1)
	}
	for i, e := range eps {
		vals[i], has[i] = s.attr.producer.Attribute(s.attr.name, e)
		if has[i] && !s.fixed {
			lo, hi = min(lo, vals[i]), max(hi, vals[i])
		}
	}
	for i := range eps {
		if !has[i] {
			continue // scores[i] stays 0
		}
		if hi <= lo {
			scores[i] = 1 // every endpoint with the attribute alike
			continue
		}
		x := (min(max(vals[i], lo), hi) - lo) / (hi - lo)
		if s.lowerBetter {
			x = 1 - x
		}
		scores[i] = x
	}
}

var (
	_ scheduling.Filter   = (*Filter)(nil)
	_ scheduling.Scorer   = (*Scorer)(nil)
	_ scheduling.Resolver = (*Filter)(nil)
	_ scheduling.Resolver = (*Scorer)(nil)
)
