package predictedlatencyscorer

import (
	"context"
	"fmt"
	"math"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Weight scale of the weighted draws (GIE's integer weights).
const (
	wMax      = 100
	minWeight = 1
	negRange  = 80
	tiny      = 1e-9
)

// cand is one candidate's prediction against the request's SLO.
type cand struct {
	i          int // index into the scored candidates
	e          *endpoints.Endpoint
	ttft, tpot float64 // predicted (quantile), ms
	ttftH      float64 // TTFT headroom, ms
	tpotH      float64 // TPOT headroom, ms (0 without streamingMode)
	valid      bool    // predicted to meet every SLO
	prefix     float64 // share of the prompt in its prefix cache
	running    int     // this scorer's requests running on it
}

type choice struct {
	c *cand
	w int
}

// candidates evaluates the predictions for eps; ok is false when some
// candidate has none.
func (s *Scorer) candidates(cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) ([]cand, bool) {
	out := make([]cand, 0, len(eps))
	preds, ok := scheduling.Read(cs, latency.PredictionsKey)
	if !ok {
		for i, e := range eps {
			n, _ := s.runningOf(e.Address())
			out = append(out, cand{i: i, e: e, running: n})
		}
		return out, false
	}
	ttftSLO, tpotSLO := ms(req.TTFTSLO), ms(req.TPOTSLO)
	factor := s.params.SLOBufferFactor
	seen := make([]bool, len(eps))
	preds.FillTPOT()
	preds.Align(eps, func(i, k int) {
		seen[i] = true
		est := preds.Estimates[k]
		n, podMin := s.runningOf(eps[i].Address())
		c := cand{i: i, e: eps[i], ttft: ms(est.TTFTQuantile), tpot: ms(est.TPOTQuantile), prefix: preds.Held[k], running: n}
		c.ttftH = ttftSLO - c.ttft
		ttftOK, tpotOK := c.ttft < ttftSLO, true
		if s.params.StreamingMode {
			buffered := tpotSLO * factor
			if podMin > 0 {
				buffered = min(buffered, podMin*factor)
			}
			tpotOK = c.tpot < buffered
			c.tpotH = buffered - c.tpot
		}
		c.valid = ttftOK && tpotOK
		out = append(out, c)
	})
	if len(out) == len(eps) {
		return out, true
	}
	// Some candidate was never predicted: composite over all of them,
	// with the prefix hits that are known.
	all := make([]cand, len(eps))
	for i, e := range eps {
		n, _ := s.runningOf(e.Address())
		all[i] = cand{i: i, e: e, running: n}
	}
	for _, c := range out {
		all[c.i].prefix = c.prefix
	}
	return all, false
}

// Score implements scheduling.Scorer: the chosen endpoint scores 1.
func (s *Scorer) Score(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	if c := s.pick(cs, req, eps); c != nil {
		scores[c.i] = 1
	}
}

func (s *Scorer) pick(cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) *cand {
	if len(eps) == 0 {
		return nil
	}
	all, predicted := s.candidates(cs, req, eps)
	if !predicted {
		return s.composite(all, StrategyCompositeOnly)
	}
	all, _ = s.affinityGate(all, s.params.AffinityGateTauGlobal)
	var pos, neg []cand
	for _, c := range all {
		if c.tpotH >= 0 && c.ttftH >= 0 {
			pos = append(pos, c)
		} else {
			neg = append(neg, c)
		}
	}
	switch {
	case s.params.HeadroomSelectionStrategy == StrategyCompositeOnly:
		return s.composite(all, StrategyCompositeOnly)
	case len(pos) > 0 && len(neg) > 0:
		if s.rand.Float64() < s.params.EpsilonExploreNeg {
			return s.pickNegative(neg)
		}
		return s.pickPositive(pos)
	case len(pos) > 0:
		return s.pickPositive(pos)
	default:
		return s.pickNegative(neg)
	}
}

// affinityGate keeps the candidates holding at least tau of the prompt,
// unless none does, exploration skips the gate, or the best of them is
// predicted over affinityMaxTTFTPenaltyMs slower to first token than the
// best of all. sticky reports that the gate applied.
func (s *Scorer) affinityGate(cs []cand, tau float64) (kept []cand, sticky bool) {
	if tau <= 0 {
		return cs, false
	}
	var eligible []cand
	for _, c := range cs {
		if c.prefix >= tau {
			eligible = append(eligible, c)
		}
	}
	if len(eligible) == 0 || s.rand.Float64() < s.params.EpsilonExploreSticky {
		return cs, false
	}
	if limit := s.params.AffinityMaxTTFTPenaltyMs; limit > 0 {
		bestAll, bestSticky := bestTTFT(cs), bestTTFT(eligible)
		if !math.IsInf(bestAll, 1) && !math.IsInf(bestSticky, 1) && bestSticky-bestAll > limit {
			return cs, false
		}
	}
	return eligible, true
}

func bestTTFT(cs []cand) float64 {
	best := math.Inf(1)
	for _, c := range cs {
		if c.ttft > 0 && c.ttft < best {
			best = c.ttft
		}
	}
	return best
}

// withinTier applies a tier's affinity gate (affinityGateTau) and the
// composite strategies: done reports that the pick is made.
func (s *Scorer) withinTier(tier []cand) (picked *cand, kept []cand, done bool) {
	if len(tier) == 1 {
		return &tier[0], nil, true
	}
	kept, sticky := s.affinityGate(tier, s.params.AffinityGateTau)
	if sticky && len(kept) == 1 {
		return &kept[0], nil, true
	}
	if st := s.params.HeadroomSelectionStrategy; st == StrategyCompositeLeast || st == StrategyCompositeMost {
		return s.composite(kept, st), nil, true
	}
	return nil, kept, false
}

func (s *Scorer) pickPositive(pos []cand) *cand {
	picked, cs, done := s.withinTier(pos)
	if done {
		return picked
	}
	loT, hiT, loP, hiP := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, c := range cs {
		loT, hiT = min(loT, c.ttftH), max(hiT, c.ttftH)
		loP, hiP = min(loP, c.tpotH), max(hiP, c.tpotH)
	}
	alpha, beta := s.blend(s.params.HeadroomTTFTWeight, s.params.HeadroomTPOTWeight)
	choices := make([]choice, 0, len(cs))
	for k := range cs {
		c := &cs[k]
		nT, nP := 0.5, 0.5
		if hiT-loT > tiny {
			nT = (c.ttftH - loT) / (hiT - loT + tiny)
		}
		if hiP-loP > tiny {
			nP = (c.tpotH - loP) / (hiP - loP + tiny)
		}
		combined := alpha*nT + beta*nP
		if s.params.HeadroomSelectionStrategy != StrategyMost {
			combined = 1 - combined // least: pack onto the tightest
		}
		choices = append(choices, choice{c, int(combined*(wMax-minWeight)) + minWeight + 1})
	}
	return s.draw(choices)
}

// blend normalises a TTFT/TPOT weight pair; without streamingMode TPOT
// has no headroom and TTFT alone counts.
func (s *Scorer) blend(a, b float64) (float64, float64) {
	if !s.params.StreamingMode || a+b <= 0 {
		return 1, 0
	}
	return a / (a + b), b / (a + b)
}

func (s *Scorer) pickNegative(neg []cand) *cand {
	if len(neg) == 1 {
		return &neg[0]
	}
	var idle, busy []cand
	for _, c := range neg {
		if c.running == 0 {
			idle = append(idle, c)
		} else {
			busy = append(busy, c)
		}
	}
	if len(idle) > 0 {
		neg = idle
	} else {
		neg = busy
	}
	picked, cs, done := s.withinTier(neg)
	if done {
		return picked
	}
	// Violation classes in GIE's order; each is weighted within itself.
	var classes [4][]*cand
	for k := range cs {
		c := &cs[k]
		switch {
		case c.ttftH < 0 && c.tpotH < 0:
			classes[0] = append(classes[0], c)
		case c.ttftH < 0:
			classes[1] = append(classes[1], c)
		case c.tpotH < 0:
			classes[2] = append(classes[2], c)
		default:
			classes[3] = append(classes[3], c)
		}
	}
	alpha, beta := s.blend(s.params.NegHeadroomTTFTWeight, s.params.NegHeadroomTPOTWeight)
	choices := make([]choice, 0, len(cs))
	for _, class := range classes[:3] {
		choices = append(choices, deficitChoices(class, alpha, beta)...)
	}
	for _, c := range classes[3] {
		choices = append(choices, choice{c, minWeight})
	}
	return s.draw(choices)
}

// deficitChoices weights candidates by their SLO deficits, normalised
// within the class: the smaller the blended deficit, the heavier.
func deficitChoices(class []*cand, alpha, beta float64) []choice {
	if len(class) == 0 {
		return nil
	}
	def := func(h float64) float64 { return max(0, -h) }
	loT, hiT, loP, hiP := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, c := range class {
		loT, hiT = min(loT, def(c.ttftH)), max(hiT, def(c.ttftH))
		loP, hiP = min(loP, def(c.tpotH)), max(hiP, def(c.tpotH))
	}
	out := make([]choice, 0, len(class))
	for _, c := range class {
		nT, nP := 0.0, 0.0
		if hiT-loT > tiny {
			nT = (def(c.ttftH) - loT) / (hiT - loT + tiny)
		}
		if hiP-loP > tiny {
			nP = (def(c.tpotH) - loP) / (hiP - loP + tiny)
		}
		out = append(out, choice{c, int((1-(alpha*nT+beta*nP))*negRange) + minWeight + 1})
	}
	return out
}

// composite draws by free KV cache, relative queue and prefix hit;
// composite-least inverts the weights.
func (s *Scorer) composite(cs []cand, strategy string) *cand {
	p := s.params
	wkv, wq, wp := p.CompositeKVWeight, p.CompositeQueueWeight, p.CompositePrefixWeight
	if sum := wkv + wq + wp; sum > 0 {
		wkv, wq, wp = wkv/sum, wq/sum, wp/sum
	} else {
		wkv, wq, wp = 1, 0, 0
	}
	minQ, maxQ := math.MaxInt, -1
	for _, c := range cs {
		q := c.e.Metrics().WaitingQueueSize
		minQ, maxQ = min(minQ, q), max(maxQ, q)
	}
	choices := make([]choice, 0, len(cs))
	for k := range cs {
		m := cs[k].e.Metrics()
		relQ := 1.0
		if maxQ > minQ {
			relQ = float64(maxQ-m.WaitingQueueSize) / float64(maxQ-minQ)
		}
		comp := wkv*(1-m.KVCacheUsage) + wq*relQ + wp*cs[k].prefix
		w := int(math.Round(minWeight + (wMax-minWeight)*comp))
		if strategy == StrategyCompositeLeast {
			w = minWeight + wMax - w
		}
		choices = append(choices, choice{&cs[k], w})
	}
	return s.draw(choices)
}

// draw picks by weight: a weighted random draw, or (selectionMode max) the
// first heaviest.
func (s *Scorer) draw(choices []choice) *cand {
	total := 0
	for _, c := range choices {
		total += max(0, c.w)
	}
	if len(choices) == 0 || total == 0 {
		return nil
	}
	if s.params.SelectionMode == SelectionMax {
		best := choices[0]
		for _, c := range choices[1:] {
			if c.w > best.w {
				best = c
			}
		}
		return best.c
	}
	idx := s.rand.IntN(total)
	for _, c := range choices {
		if idx < max(0, c.w) {
			return c.c
		}
		idx -= max(0, c.w)
	}
	return choices[0].c
}

// Admit implements scheduling.Admitter (GIE's AdmitRequest).
func (s *Scorer) Admit(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) error {
	if !flowcontrol.Sheddable(req.Priority) || req.TTFTSLO <= 0 || (s.params.StreamingMode && req.TPOTSLO <= 0) {
		return nil
	}
	all, predicted := s.candidates(cs, req, eps)
	if !predicted || len(all) == 0 {
		return nil
	}
	for _, c := range all {
		sticky := s.params.AffinityGateTauGlobal > 0 && c.prefix >= s.params.AffinityGateTauGlobal
		if c.valid || c.running == 0 || c.e.Metrics().KVCacheUsage < coldKVUsage || sticky {
			return nil
		}
	}
	return fmt.Errorf("%s: %w", s.TypedName(), ErrNoValidEndpoint)
}
