// Package prefixaffinity is the prefix-cache-affinity-filter: when some
// candidates hold at least affinityThreshold of the request's prompt in
// their prefix cache, only they are kept — a sticky session stays where its
// cache is — unless staying would cost more than maxTTFTPenaltyMs of TTFT
// over the best candidate (the cache holder is overloaded: recomputing the
// prefix elsewhere is faster). With probability explorationProbability it
// keeps everyone, so that other endpoints get to warm up.
//
// The held share comes from the predicted-latency-producer when it ran, else
// from the prefix producer's match. The TTFT of each candidate comes from
// the latency predictor (ttftSource latencyPredictor, needs the producer) or
// is estimated as its prefill work over peakPrefillThroughput (ttftSource
// prefillThroughput: the live prefill backlog plus the uncached tokens).
//
// Parameters (llm-d's, with the blog's older names):
//
//	affinityThreshold: float       default 0.80
//	affinityGateTau: float         its older name
//	explorationProbability: float  default 0
//	epsilonExploreSticky: float    its older name
//	maxTTFTPenaltyMs: float        default 18000
//	ttftSource: string             prefillThroughput (default) | latencyPredictor
//	peakPrefillThroughput: float   tokens/s, default 15928
package prefixaffinity

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "prefix-cache-affinity-filter"

// TTFT sources.
const (
	SourcePrefillThroughput = "prefillThroughput"
	SourceLatencyPredictor  = "latencyPredictor"
)

// Params are the plugin's parameters.
type Params struct {
	AffinityThreshold      *float64 `json:"affinityThreshold"`
	AffinityGateTau        *float64 `json:"affinityGateTau"`
	ExplorationProbability *float64 `json:"explorationProbability"`
	EpsilonExploreSticky   *float64 `json:"epsilonExploreSticky"`
	MaxTTFTPenaltyMs       float64  `json:"maxTTFTPenaltyMs"`
	TTFTSource             string   `json:"ttftSource"`
	PeakPrefillThroughput  float64  `json:"peakPrefillThroughput"`
}

// Filter implements prefix-cache-affinity-filter.
type Filter struct {
	scheduling.Named
	threshold, explore float64
	penalty            time.Duration
	source             string
	peak               float64
	rand               scheduling.Rand
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{MaxTTFTPenaltyMs: 18000, TTFTSource: SourcePrefillThroughput, PeakPrefillThroughput: 15928}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	threshold, err := either("affinityThreshold", p.AffinityThreshold, "affinityGateTau", p.AffinityGateTau, 0.80)
	if err != nil {
		return nil, err
	}
	explore, err := either("explorationProbability", p.ExplorationProbability, "epsilonExploreSticky", p.EpsilonExploreSticky, 0)
	if err != nil {
		return nil, err
	}
	switch {
	case threshold < 0 || threshold > 1:
		return nil, fmt.Errorf("parameters.affinityThreshold must be in [0, 1], got %v", threshold)
	case explore < 0 || explore > 1:
		return nil, fmt.Errorf("parameters.explorationProbability must be in [0, 1], got %v", explore)
	case p.MaxTTFTPenaltyMs < 0:
		return nil, fmt.Errorf("parameters.maxTTFTPenaltyMs must not be negative")
	case p.MaxTTFTPenaltyMs*float64(time.Millisecond) >= math.MaxInt64:
		// As a duration it would wrap negative: affinity never kept.
		return nil, fmt.Errorf("parameters.maxTTFTPenaltyMs must be under %.0f, got %v", float64(math.MaxInt64)/float64(time.Millisecond), p.MaxTTFTPenaltyMs)
	case p.TTFTSource != SourcePrefillThroughput && p.TTFTSource != SourceLatencyPredictor:
		return nil, fmt.Errorf("parameters.ttftSource: want %q or %q, got %q", SourcePrefillThroughput, SourceLatencyPredictor, p.TTFTSource)
	case p.PeakPrefillThroughput <= 0:
		return nil, fmt.Errorf("parameters.peakPrefillThroughput must be positive")
	}
	return &Filter{
		Named: scheduling.NewNamed(Type, name), threshold: threshold, explore: explore,
		penalty: time.Duration(p.MaxTTFTPenaltyMs * float64(time.Millisecond)),
		source:  p.TTFTSource, peak: p.PeakPrefillThroughput, rand: scheduling.RandOf(h),
	}, nil
}

// either resolves a parameter with a current and a deprecated name.
func either(name string, v *float64, old string, ov *float64, def float64) (float64, error) {
	switch {
	case v != nil && ov != nil:
		return 0, fmt.Errorf("parameters: %s and its older name %s are both set", name, old)
	case v != nil:
		return *v, nil
	case ov != nil:
		return *ov, nil
	}
	return def, nil
}

// Filter implements scheduling.Filter.
func (f *Filter) Filter(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	if len(eps) < 2 || (f.explore > 0 && f.rand.Float64() < f.explore) {
		return eps
	}
	held, ttft, ok := f.view(cs, req, eps)
	if !ok {
		return eps
	}
	best, bestSticky := time.Duration(-1), time.Duration(-1)
	sticky := 0
	for i := range eps {
		if best < 0 || ttft[i] < best {
			best = ttft[i]
		}
		if held[i] >= f.threshold && held[i] > 0 {
			sticky++
			if bestSticky < 0 || ttft[i] < bestSticky {
				bestSticky = ttft[i]
			}
		}
	}
	if sticky == 0 || sticky == len(eps) || bestSticky-best > f.penalty {
		return eps
	}
	out := eps[:0:0]
	for i, e := range eps {
		if held[i] >= f.threshold && held[i] > 0 {
			out = append(out, e)
		}
	}
	return out
}

// view returns each candidate's held share of the prompt and its TTFT
// estimate; false when no producer told what the candidates hold.
func (f *Filter) view(cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) ([]float64, []time.Duration, bool) {
	held := make([]float64, len(eps))
	ttft := make([]time.Duration, len(eps))
	if preds, ok := scheduling.Read(cs, latency.PredictionsKey); ok {
		preds.Align(eps, func(i, k int) {
			held[i] = preds.Held[k]
			if f.source == SourceLatencyPredictor {
				ttft[i] = preds.Estimates[k].TTFT
			} else {
				ft := preds.Features[k]
				ttft[i] = f.throughputTTFT(ft.Prefill + ft.Backlog)
			}
		})
		return held, ttft, true
	}
	if f.source == SourceLatencyPredictor {
		return nil, nil, false
	}
	match, ok := scheduling.Read(cs, prefixmatch.MatchKey)
	if !ok {
		return nil, nil, false
	}
	// Counted as the match counts the prompt: a text prompt's length-based
	// estimate against exact held tokens would overstate the share held.
	prompt := match.Prompt(req.PromptTokens)
	if prompt == 0 {
		return nil, nil, false
	}
	for i, e := range eps {
		h := match.HeldTokensOf(e)
		held[i] = float64(h) / float64(prompt)
		ttft[i] = f.throughputTTFT(float64(e.Load().PrefillTokens + int64(prefixmatch.Uncached(prompt, h))))
	}
	return held, ttft, true
}

func (f *Filter) throughputTTFT(tokens float64) time.Duration {
	// Clamped: a wrapped (negative) TTFT would read as the best, or as
	// none (the filter's -1).
	if ns := tokens / f.peak * float64(time.Second); ns < math.MaxInt64 {
		return time.Duration(ns)
	}
	return time.Duration(math.MaxInt64)
}

var _ scheduling.Filter = (*Filter)(nil)
