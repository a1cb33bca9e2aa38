package prefixmatch

import (
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Prediction is what a prefix scorer expects for one request, kept in the
// cycle state: the blocks each candidate holds (from Score), what it then
// predicted for the chosen endpoint (PreRequest), checked against the
// server's reported cached tokens (ResponseComplete).
type Prediction struct {
	// BlockTokens converts blocks into tokens; PromptTokens is the prompt's
	// length.
	BlockTokens  int
	PromptTokens int
	// matched lists the candidates holding blocks; a slice, not a map: it
	// is written once per candidate and read once, on the hot path.
	matched   []heldBlocks
	predicted int
}

type heldBlocks struct {
	endpoint *endpoints.Endpoint
	blocks   float64
}

// Matched records that endpoint e holds blocks of the prompt (tier-weighted
// blocks may be fractional).
func (p *Prediction) Matched(e *endpoints.Endpoint, blocks float64) {
	if blocks > 0 {
		p.matched = append(p.matched, heldBlocks{e, blocks})
	}
}

// Predict records the prediction for res's primary target and returns that
// target; nil when nothing was picked.
func (p *Prediction) Predict(res *scheduling.Result, rec Recorder, plugin scheduling.TypedName) *endpoints.Endpoint {
	primary := res.Primary()
	if primary == nil || len(primary.Targets) == 0 {
		return nil
	}
	target := primary.Targets[0]
	p.predicted = 0
	for _, m := range p.matched {
		if m.endpoint == target {
			p.predicted = int(m.blocks * float64(p.BlockTokens))
		}
	}
	rec.PrefixPredicted(plugin, p.predicted, p.PromptTokens)
	return target
}

// Check records how the prediction compares with what the server reported
// for a completed response.
func (p *Prediction) Check(res *scheduling.Response, rec Recorder, plugin scheduling.TypedName) {
	if !res.Complete || res.Usage.PromptTokens == 0 {
		return
	}
	rec.PrefixActual(plugin, p.predicted, res.Usage.CachedTokens)
}
