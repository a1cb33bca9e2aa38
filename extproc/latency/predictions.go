package latency

import (
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// PredictionsKey is the cycle-state key of the predicted-latency-producer's
// *Predictions, which the latency scorer, the SLO filters and the admitter
// read. They are valid from the producer stage until PreRequest, when the
// producer keeps the chosen endpoint's estimate and recycles the arrays:
// later hooks must not read them.
var PredictionsKey = scheduling.NewKey[*Predictions]("predicted-latency")

// Predictions are one request's estimates on every candidate, in the
// producer's candidate order.
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
}

// Reset sizes p for candidates, reusing its slices.
func (p *Predictions) Reset(candidates []*endpoints.Endpoint) {
	p.Candidates = candidates
	n := len(candidates)
	p.Estimates = scheduling.Resized(p.Estimates, n)
	p.Features = scheduling.Resized(p.Features, n)
	p.Held = scheduling.Resized(p.Held, n)
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
