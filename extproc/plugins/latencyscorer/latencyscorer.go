// Package latencyscorer is the latency-scorer: it scores candidates by the
// predicted-latency-producer's TTFT and TPOT predictions.
//
// Without an SLO on the request, lower predicted latency scores higher: each
// of TTFT and TPOT scores best/predicted (1 for the fastest candidate), and
// the two mix by ttftWeight and tpotWeight. A candidate's TTFT counts with
// what the request would add to the TTFTs of requests already queued there
// (latency.Estimate.Imposed: its first chunk lengthens the step that
// finishes their prompts), so a burst spreads where joining would slow
// the requests before it more than it speeds this one. The ratio, unlike a min-max
// stretch, keeps near-equal candidates near-equal, so a tie stays a tie for
// the picker to break.
//
// With an SLO (x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms), candidates are
// ranked by headroom: how far their cautious (quantile) prediction stays
// inside the SLO. Candidates that meet it score in (0.5, 1], ordered by
// headroomSelectionStrategy: "least" packs requests onto the endpoint with
// the least spare headroom (keeping others free for tight requests), "most"
// spreads onto the most. Candidates that miss it score in [0, 0.5), least
// negative first.
//
// Without predictions (no producer configured) it falls back to a
// composite of free KV cache, short queue and prefix-cache hit, weighted
// by compositeKVWeight, compositeQueueWeight and compositePrefixWeight.
//
// Parameters (llm-d's):
//
//	ttftWeight: float                 default 0.8
//	tpotWeight: float                 default 0.2
//	headroomSelectionStrategy: string least (default) | most
//	compositeKVWeight: float          default 1
//	compositeQueueWeight: float       default 1
//	compositePrefixWeight: float      default 1
package latencyscorer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "latency-scorer"

// Headroom selection strategies.
const (
	StrategyLeast = "least"
	StrategyMost  = "most"
)

// Params are the plugin's parameters.
type Params struct {
	TTFTWeight                float64 `json:"ttftWeight"`
	TPOTWeight                float64 `json:"tpotWeight"`
	HeadroomSelectionStrategy string  `json:"headroomSelectionStrategy"`
	CompositeKVWeight         float64 `json:"compositeKVWeight"`
	CompositeQueueWeight      float64 `json:"compositeQueueWeight"`
	CompositePrefixWeight     float64 `json:"compositePrefixWeight"`
}

// Scorer implements latency-scorer.
type Scorer struct {
	scheduling.Named
	params Params
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{TTFTWeight: 0.8, TPOTWeight: 0.2, HeadroomSelectionStrategy: StrategyLeast, CompositeKVWeight: 1, CompositeQueueWeight: 1, CompositePrefixWeight: 1}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.HeadroomSelectionStrategy != StrategyLeast && p.HeadroomSelectionStrategy != StrategyMost {
		return nil, fmt.Errorf("parameters.headroomSelectionStrategy: want %q or %q, got %q", StrategyLeast, StrategyMost, p.HeadroomSelectionStrategy)
	}
	for field, w := range map[string]float64{"ttftWeight": p.TTFTWeight, "tpotWeight": p.TPOTWeight, "compositeKVWeight": p.CompositeKVWeight, "compositeQueueWeight": p.CompositeQueueWeight, "compositePrefixWeight": p.CompositePrefixWeight} {
		if w < 0 {
			return nil, fmt.Errorf("parameters.%s must not be negative, got %v", field, w)
		}
	}
	if p.TTFTWeight+p.TPOTWeight == 0 {
		return nil, fmt.Errorf("parameters.ttftWeight and tpotWeight must not both be 0")
	}
	return &Scorer{Named: scheduling.NewNamed(Type, name), params: p}, nil
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	preds, ok := scheduling.Read(cs, latency.PredictionsKey)
	if !ok {
		s.composite(cs, eps, scores)
		return
	}
	if s.params.TPOTWeight > 0 {
		preds.FillTPOT()
	}
	slo := latency.SLOOf(req)
	if slo.Set() {
		s.headroom(preds, slo, eps, scores)
		return
	}
	if slices.Equal(eps, preds.Candidates) {
		// Nothing filtered: the estimates are indexed like eps (once per
		// decision over every candidate, without Align's calls).
		s.fastest(preds.Estimates[:len(eps)], scores)
		return
	}
	var bestTTFT, bestTPOT float64
	preds.Align(eps, func(_, k int) {
		bestTTFT, bestTPOT = best(bestTTFT, bestTPOT, &preds.Estimates[k])
	})
	wTTFT, wTPOT, ok := s.weights(bestTPOT)
	if !ok {
		return
	}
	preds.Align(eps, func(i, k int) {
		scores[i] = relative(&preds.Estimates[k], bestTTFT, bestTPOT, wTTFT, wTPOT)
	})
}

// fastest scores candidates whose estimates are est, in order.
func (s *Scorer) fastest(est []latency.Estimate, scores []float64) {
	if s.params.TPOTWeight == 0 {
		fastestTTFT(est, scores, s.params.TTFTWeight)
		return
	}
	var bestTTFT, bestTPOT float64
	for k := range est {
		bestTTFT, bestTPOT = best(bestTTFT, bestTPOT, &est[k])
	}
	wTTFT, wTPOT, ok := s.weights(bestTPOT)
	if !ok {
		return
	}
	for k := range est {
		scores[k] = relative(&est[k], bestTTFT, bestTPOT, wTTFT, wTPOT)
	}
}

// fastestTTFT is fastest by TTFT alone (tpotWeight 0, ttftWeight w), the
// same scores (relative's operations, in its order) with one conversion of
// each TTFT (with the delay it imposes): the first pass leaves the seconds
// in scores.
func fastestTTFT(est []latency.Estimate, scores []float64, w float64) {
	scores = scores[:len(est)]
	var bestTTFT float64
	for k := range est {
		t := (est[k].TTFT + est[k].Imposed).Seconds()
		if bestTTFT == 0 || t < bestTTFT {
			bestTTFT = t
		}
		scores[k] = t
	}
	for k, t := range scores {
		scores[k] = w * bestTTFT / t / w
	}
}

// best takes e into the lowest TTFT and TPOT so far (0: none; a TPOT of 0
// is unknown).
func best(bestTTFT, bestTPOT float64, e *latency.Estimate) (float64, float64) {
	if t := (e.TTFT + e.Imposed).Seconds(); bestTTFT == 0 || t < bestTTFT {
		bestTTFT = t
	}
	if t := e.TPOT.Seconds(); t > 0 && (bestTPOT == 0 || t < bestTPOT) {
		bestTPOT = t
	}
	return bestTTFT, bestTPOT
}

// weights are the TTFT and TPOT weights given the best TPOT; not ok when
// they sum to 0.
func (s *Scorer) weights(bestTPOT float64) (wTTFT, wTPOT float64, ok bool) {
	wTTFT, wTPOT = s.params.TTFTWeight, s.params.TPOTWeight
	if bestTPOT == 0 {
		wTPOT = 0 // no candidate predicts TPOT (prefill pods)
	}
	return wTTFT, wTPOT, wTTFT+wTPOT != 0
}

// relative is a candidate's score: its latencies relative to the best.
func relative(e *latency.Estimate, bestTTFT, bestTPOT, wTTFT, wTPOT float64) float64 {
	sc := wTTFT * bestTTFT / (e.TTFT + e.Imposed).Seconds()
	if wTPOT > 0 && e.TPOT > 0 {
		sc += wTPOT * bestTPOT / e.TPOT.Seconds()
	}
	return sc / (wTTFT + wTPOT)
}

func (s *Scorer) headroom(preds *latency.Predictions, slo latency.SLO, eps []*endpoints.Endpoint, scores []float64) {
	type ranked struct {
		i     int
		h     float64
		meets bool
	}
	var lo, hi [2]float64 // per tier (0 misses, 1 meets): headroom range
	first := [2]bool{true, true}
	all := make([]ranked, 0, len(eps))
	preds.Align(eps, func(i, k int) {
		h, meets := preds.Headroom(k, slo, s.params.TTFTWeight, s.params.TPOTWeight)
		t := 0
		if meets {
			t = 1
		}
		if first[t] || h < lo[t] {
			lo[t] = h
		}
		if first[t] || h > hi[t] {
			hi[t] = h
		}
		first[t] = false
		all = append(all, ranked{i, h, meets})
	})
	for _, r := range all {
		t := 0
		if r.meets {
			t = 1
		}
		pos := 1.0 // position in the tier's headroom range, 1 = most
		if hi[t] > lo[t] {
			pos = (r.h - lo[t]) / (hi[t] - lo[t])
		}
		if r.meets {
			if s.params.HeadroomSelectionStrategy == StrategyLeast {
				pos = 1 - pos
			}
			scores[r.i] = 0.5 + 0.5*(0.02+0.98*pos)
		} else {
			scores[r.i] = 0.49 * pos
		}
	}
}

// composite is the fallback without predictions.
func (s *Scorer) composite(cs *scheduling.CycleState, eps []*endpoints.Endpoint, scores []float64) {
	p := s.params
	total := p.CompositeKVWeight + p.CompositeQueueWeight + p.CompositePrefixWeight
	if total == 0 {
		return
	}
	maxQueue := 0
	for _, e := range eps {
		maxQueue = max(maxQueue, e.Metrics().WaitingQueueSize)
	}
	var held []float64
	if match, ok := scheduling.Read(cs, prefixmatch.MatchKey); ok && match.PromptTokens > 0 {
		held = make([]float64, len(eps))
		for i, e := range eps {
			held[i] = float64(match.HeldTokensOf(e)) / float64(match.PromptTokens)
		}
	}
	for i, e := range eps {
		m := e.Metrics()
		sc := p.CompositeKVWeight * (1 - min(1, max(0, m.KVCacheUsage)))
		if maxQueue > 0 {
			sc += p.CompositeQueueWeight * (1 - float64(m.WaitingQueueSize)/float64(maxQueue))
		} else {
			sc += p.CompositeQueueWeight
		}
		if held != nil {
			sc += p.CompositePrefixWeight * held[i]
		}
		scores[i] = sc / total
	}
}

var _ scheduling.Scorer = (*Scorer)(nil)
