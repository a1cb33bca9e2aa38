// Package contextlengthaware is llm-d's context-length-aware filter and
// scorer: endpoints carry a label "min-max" naming the prompt lengths (in
// tokens) they serve, and a request goes to those whose range holds its
// prompt. Endpoints without the label accept any length (neutral score
// 0.5); a malformed label is never kept and scores 0.
//
// Parameters (llm-d's names):
//
//	label: string            the range label (default
//	                         llm-d.ai/context-length-range)
//	enableFiltering: bool    also drop endpoints whose range misses the
//	                         request (default false: score only)
//
// Score, as llm-d's: in range, 0.3 + 0.7 × (0.7 × 1/(1 + width/10000) +
// 0.3 × headroom/width) (1 for a one-length range), so a tighter range and
// more headroom win; out of range, 0.3/(1 + distance/1000), below any
// in-range score, so the nearest range wins a request none holds.
package contextlengthaware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "context-length-aware"

// DefaultLabel is llm-d's range label.
const DefaultLabel = "llm-d.ai/context-length-range"

// Params are the plugin's parameters.
type Params struct {
	Label           string `json:"label"`
	EnableFiltering bool   `json:"enableFiltering"`
}

// Plugin implements context-length-aware.
type Plugin struct {
	scheduling.Named
	label  string
	filter bool
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{Label: DefaultLabel}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.Label == "" {
		return nil, errors.New("parameters.label must not be empty")
	}
	return &Plugin{Named: scheduling.NewNamed(Type, name), label: p.Label, filter: p.EnableFiltering}, nil
}

// Filter keeps the endpoints whose range holds the prompt, and those
// without the label; with enableFiltering false it keeps all.
func (p *Plugin) Filter(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	if !p.filter {
		return eps
	}
	n := promptTokens(req)
	kept := make([]*endpoints.Endpoint, 0, len(eps))
	for _, e := range eps {
		v, ok := e.Spec().Labels[p.label]
		if !ok {
			kept = append(kept, e)
			continue
		}
		if r, err := parseRange(v); err == nil && n >= r.min && n <= r.max {
			kept = append(kept, e)
		}
	}
	return kept
}

// Score rates each endpoint's range against the prompt.
func (p *Plugin) Score(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	n := promptTokens(req)
	for i, e := range eps {
		v, ok := e.Spec().Labels[p.label]
		if !ok {
			scores[i] = 0.5
			continue
		}
		r, err := parseRange(v)
		if err != nil {
			scores[i] = 0
			continue
		}
		scores[i] = r.score(n)
	}
}

func promptTokens(req *scheduling.Request) int {
	if req == nil {
		return 0
	}
	return req.PromptTokens
}

type lengthRange struct{ min, max int }

func parseRange(s string) (lengthRange, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok || strings.Contains(hi, "-") {
		return lengthRange{}, fmt.Errorf("range %q: want min-max", s)
	}
	minV, err := strconv.Atoi(strings.TrimSpace(lo))
	if err != nil {
		return lengthRange{}, fmt.Errorf("range %q: min: %w", s, err)
	}
	maxV, err := strconv.Atoi(strings.TrimSpace(hi))
	if err != nil {
		return lengthRange{}, fmt.Errorf("range %q: max: %w", s, err)
	}
	if minV > maxV {
		return lengthRange{}, fmt.Errorf("range %q: min above max", s)
	}
	return lengthRange{minV, maxV}, nil
}

// maxFallback bounds out-of-range scores, so an in-range endpoint always
// wins.
const maxFallback = 0.3

func (r lengthRange) score(n int) float64 {
	if n >= r.min && n <= r.max {
		width := r.max - r.min
		if width == 0 {
			return 1
		}
		raw := 0.7/(1+float64(width)/10000) + 0.3*float64(r.max-n)/float64(width)
		return maxFallback + raw*(1-maxFallback)
	}
	d := r.min - n
	if n > r.max {
		d = n - r.max
	}
	return maxFallback / (1 + float64(d)/1000)
}

var (
	_ scheduling.Filter = (*Plugin)(nil)
	_ scheduling.Scorer = (*Plugin)(nil)
)
