package latency

import (
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// PredictionsKey is the cycle-state key of the predicted-latency-producer's
// *Predictions, which the latency scorer, the SLO filters and the admitter
// read. They are valid from the producer stage until the decision is made
// (after every PreRequest and Hold hook, scheduling.CycleState.Decided),
// when the producer, which kept the chosen endpoint's estimate in its
// PreRequest, recycles the arrays: response hooks must not read them.
var PredictionsKey = scheduling.NewKey[*Predictions]("predicted-latency")

// Predictions are one request's estimates on every candidate, in the
// producer's candidate order.
//
// Most decisions read no candidate's TPOT (the latency scorer of kvgate's
// precise policy weighs TTFT only, and the SLO checks read TPOT only for
// requests with a TPOT objective), so a producer may leave the TPOT fields
// of Estimates to be computed on first need (DeferTPOT): a reader of
// Estimates[k].TPOT or TPOTQuantile calls FillTPOT first, or reads
// Estimate(k). Headroom does so itself.
type Predictions struct {
	Candidates []*endpoints.Endpoint
	Estimates  []Estimate
	Features   []Features
	// Held is the share of the prompt each candidate holds in its prefix
	// cache (0 when no prefix producer ran).
	Held []float64
	// BufferFactor scales predictions before they are compared with an
	// SLO (sloBufferFactor): above 1 is more cautious.
	BufferFactor float64

	// While tpotPending, tpot computes the TPOT fields not yet computed;
	// noTPOT marks candidates that predict none (nil: every one predicts).
	tpot        Candidates
	tpotPending bool
	noTPOT      func(*endpoints.Endpoint) bool
}

// Reset sizes p for candidates, reusing its slices.
func (p *Predictions) Reset(candidates []*endpoints.Endpoint) {
	p.Resize(candidates)
	clear(p.Estimates)
	clear(p.Features)
	clear(p.Held)
}

// Resize is Reset for a producer that then writes every element of
// Estimates, Features and Held: their old contents are not cleared.
func (p *Predictions) Resize(candidates []*endpoints.Endpoint) {
	p.Candidates = candidates
	n := len(candidates)
	p.Estimates = scheduling.Grown(p.Estimates, n)
	p.Features = scheduling.Grown(p.Features, n)
	p.Held = scheduling.Grown(p.Held, n)
	p.tpot, p.tpotPending, p.noTPOT = Candidates{}, false, nil
}

// DeferTPOT records that the TPOT fields of Estimates are not computed yet:
// they are fits' predictions from Features (the access made for
// Candidates), zero on the candidates for which noTPOT (may be nil) is
// true. They come from the fits as published when read, a few
// microseconds after the TTFTs: a response hook running concurrently may
// have published a newer fit in between (in a sequential run, as the
// cluster benchmark's, the same fit).
func (p *Predictions) DeferTPOT(fits Candidates, noTPOT func(*endpoints.Endpoint) bool) {
	p.tpot, p.tpotPending, p.noTPOT = fits, true, noTPOT
}

// FillTPOT computes the deferred TPOT fields of every candidate.
func (p *Predictions) FillTPOT() {
	if !p.tpotPending {
		return
	}
	for k := range p.Estimates {
		p.fillTPOT(k)
	}
	p.tpotPending = false
}

// Estimate is candidate k's estimate, its TPOT computed if deferred.
func (p *Predictions) Estimate(k int) Estimate {
	if p.tpotPending {
		p.fillTPOT(k)
	}
	return p.Estimates[k]
}

func (p *Predictions) fillTPOT(k int) {
	est, e := &p.Estimates[k], p.Candidates[k]
	if p.noTPOT != nil && p.noTPOT(e) {
		est.TPOT, est.TPOTQuantile = 0, 0
		return
	}
	est.TPOT, est.TPOTQuantile = p.tpot.PredictTPOT(k, e, &p.Features[k])
}

// Align calls fn(i, k) for each eps[i] found as Candidates[k]. eps is a
// filtered candidate list: a subsequence in the same order (filters keep
// order), so one merge pass pairs them; an endpoint never predicted is
// skipped.
func (p *Predictions) Align(eps []*endpoints.Endpoint, fn func(i, k int)) {
	scheduling.AlignSubset(p.Candidates, eps, fn)
}

// SLO is a request's latency objective; a zero field sets none.
type SLO struct {
	TTFT, TPOT time.Duration
}

// SLOOf is the objective the request carries.
func SLOOf(req *scheduling.Request) SLO { return SLO{TTFT: req.TTFTSLO, TPOT: req.TPOTSLO} }

// Set reports whether any objective is set.
func (s SLO) Set() bool { return s.TTFT > 0 || s.TPOT > 0 }

// Headroom is how far candidate k's cautious (quantile) estimate stays
// inside the SLO, as a share of it, averaged over the objectives set with
// weights wTTFT and wTPOT; meets reports whether every objective set is met.
func (p *Predictions) Headroom(k int, slo SLO, wTTFT, wTPOT float64) (headroom float64, meets bool) {
	if slo.TPOT > 0 {
		p.FillTPOT()
	}
	e := p.Estimates[k]
	factor := p.BufferFactor
	if factor <= 0 {
		factor = 1
	}
	meets = true
	var sum, weights float64
	if slo.TTFT > 0 {
		h := 1 - factor*e.TTFTQuantile.Seconds()/slo.TTFT.Seconds()
		sum, weights = sum+wTTFT*h, weights+wTTFT
		meets = meets && h >= 0
	}
	if slo.TPOT > 0 && e.TPOT > 0 {
		h := 1 - factor*e.TPOTQuantile.Seconds()/slo.TPOT.Seconds()
		sum, weights = sum+wTPOT*h, weights+wTPOT
		meets = meets && h >= 0
	}
	if weights == 0 {
		return 0, meets
	}
	return sum / weights, meets
}
