package latency

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// A decision predicts every candidate, and finding each one's fit by
// address is a string-keyed map lookup, a fifth of a prediction's cost.
// The candidate list rarely changes between decisions (the datastore's
// snapshot), so the model keeps the fits of the last list it saw by
// position, valid while the tracked endpoints are the same.

// maxReindexWait bounds the misses the index waits out before a rebuild
// (each allocates) while successive decisions' lists differ; meanwhile they
// look fits up by address. The wait doubles at each rebuild, and an index
// that served usefulHits decisions is replaced at the first miss.
const (
	maxReindexWait = 64
	usefulHits     = maxReindexWait
)

// fitIndex is the fits of one candidate list, by position, as of one
// version of the model's endpoint map.
type fitIndex struct {
	eps  []*endpoints.Endpoint // a copy of the list
	of   *map[string]*fit
	fits []*fit // nil: none tracked (the pool's fit predicts)
	hits atomic.Uint64
}

// Candidates is one decision's access to its candidates' fits, from
// Model.Candidates; without an index it looks them up by address.
type Candidates struct {
	m   *Model
	idx *fitIndex
}

// Candidates returns the access for a decision over eps.
func (m *Model) Candidates(eps []*endpoints.Endpoint) Candidates {
	cur := m.endpoints.Load()
	old := m.index.Load()
	if old != nil && old.of == cur && slices.Equal(old.eps, eps) {
		old.hits.Add(1)
		return Candidates{m: m, idx: old}
	}
	wait := m.reindexWait.Load()
	if old == nil || old.hits.Load() >= usefulHits {
		wait = 1
	}
	if m.misses.Add(1) < wait {
		return Candidates{m: m}
	}
	m.misses.Store(0)
	m.reindexWait.Store(min(2*wait, maxReindexWait))
	idx := &fitIndex{eps: slices.Clone(eps), of: cur, fits: make([]*fit, len(eps))}
	for i, e := range eps {
		idx.fits[i] = (*cur)[e.Address()]
	}
	m.index.Store(idx)
	return Candidates{m: m, idx: idx}
}

// PredictLive is Model.PredictLive for eps[i], e, of the list the access
// was made for.
func (c Candidates) PredictLive(i int, e *endpoints.Endpoint, f *Features, now time.Time, eng Engine) Estimate {
	return c.m.predictLive(c.fitOf(i, e), f, now, eng)
}

// PredictTTFT is PredictLive without TPOT, into *est (its TPOT fields
// zero): most decisions read no candidate's TPOT, which Predictions
// computes only when asked (Predictions.FillTPOT). now is the decision's
// instant in Unix nanoseconds (with a time.Time the arguments would not
// fit in registers); eng is nil where the server runs traffic the picker
// did not route (Engine.External): the twin does not answer there and the
// feature model predicts.
func (c Candidates) PredictTTFT(i int, e *endpoints.Endpoint, f *Features, now int64, eng *Engine, est *Estimate) {
	ft := c.fitOf(i, e)
	own, pool := c.m.coeffsOf(ft)
	if eng == nil { // predictTTFT's feature model, a call less
		*est = Estimate{}
		est.TTFT, est.TTFTQuantile = c.m.enough(own, pool, own.ttftSamples).ttftOf(f)
		return
	}
	c.m.predictTTFT(ft, own, pool, f, now, eng, est)
}

// PredictTPOT is PredictLive's TPOT alone, mean and quantile.
func (c Candidates) PredictTPOT(i int, e *endpoints.Endpoint, f *Features) (mean, quantile time.Duration) {
	own, pool := c.m.coeffsOf(c.fitOf(i, e))
	return c.m.predictTPOT(own, pool, f)
}

// fitOf is eps[i]'s fit, e; nil when none is tracked.
func (c Candidates) fitOf(i int, e *endpoints.Endpoint) *fit {
	if c.idx != nil {
		return c.idx.fits[i]
	}
	return (*c.m.endpoints.Load())[e.Address()]
}

// predictLive is PredictLive on the endpoint whose fit is e (nil: none).
// Once per candidate per decision: the fits are loaded once, and nothing
// is computed that the answer does not use.
func (m *Model) predictLive(e *fit, f *Features, now time.Time, eng Engine) Estimate {
	own, pool := m.coeffsOf(e)
	var est Estimate
	m.predictTTFT(e, own, pool, f, now.UnixNano(), &eng, &est)
	est.TPOT, est.TPOTQuantile = m.predictTPOT(own, pool, f)
	return est
}

// coeffsOf is the published fit of the endpoint whose fit is e (the
// pool's when nil) and the pool's.
func (m *Model) coeffsOf(e *fit) (own, pool *coeffs) {
	pool = m.pool.published.Load()
	if e == nil {
		return pool, pool
	}
	return e.published.Load(), pool
}

// predictTPOT is the TPOT predicted from the endpoint's published fit own
// and the pool's: 0 ("unknown") until MinSamples streams ended.
func (m *Model) predictTPOT(own, pool *coeffs, f *Features) (mean, quantile time.Duration) {
	if from := m.enough(own, pool, own.tpotSamples); from.tpotSamples >= m.cfg.MinSamples {
		return from.tpotOf(f)
	}
	return 0, 0
}
