package cluster

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/sim/engine"
)

// OracleType is the plugin type of the oracle picker, registered only in
// the benchmark's own registry.
const OracleType = "oracle-picker"

// oracle is a reference picker that no production picker can be: it reads
// every engine's true prefix cache, the blocks its queued requests will
// compute, and its prefill backlog at the instant of the decision, and
// picks the endpoint with the lowest estimated time to first token under
// the preset's timing model. It shows what perfect information buys a
// greedy per-request policy; being greedy, it is not an upper bound on
// cache reuse (see RESULTS.md).
type oracle struct {
	scheduling.Named
	s      *sim
	hashes []uint64
}

func (s *sim) newOracle(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	if err := scheduling.DecodeParams(raw, &struct{}{}); err != nil {
		return nil, err
	}
	if s.oracled == nil {
		s.oracled = make(map[string]oracleChoice)
	}
	return &oracle{Named: scheduling.NewNamed(OracleType, name), s: s}, nil
}

// Pick implements scheduling.Picker.
func (o *oracle) Pick(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, scored []scheduling.ScoredEndpoint) *scheduling.ProfileResult {
	if len(scored) == 0 {
		return nil
	}
	var prompt []int
	if req.Body != nil {
		prompt = req.Body.PromptTokenIDs
	}
	o.hashes = o.s.hasher.AppendUint64s(o.hashes[:0], prompt, kvhash.Extra{})
	best, bestUncached := -1, 0
	var bestEst time.Duration
	for i, se := range scored {
		r := o.s.byAddr[se.Endpoint.Address()]
		if r == nil {
			continue
		}
		hit := 0
		for hit < len(o.hashes) {
			h := o.hashes[hit]
			if r.cache[h] == 0 && r.pending[h] == 0 {
				break
			}
			hit++
		}
		// The engine always computes the last prompt token.
		uncached := max(len(prompt)-hit*o.s.opts.BlockSize, min(1, len(prompt)))
		est := o.s.estimateTTFT(r, uncached)
		if best < 0 || est < bestEst || (est == bestEst && r.backlog < o.s.byAddr[scored[best].Endpoint.Address()].backlog) {
			best, bestEst, bestUncached = i, est, uncached
		}
	}
	if best < 0 {
		return nil
	}
	o.s.oracled[req.ID] = oracleChoice{uncached: bestUncached, hashes: slices.Clone(o.hashes)}
	// The oracle's own estimate, scored like the picker's predictions: how
	// well perfect information predicts TTFT bounds what a learned model
	// can reach.
	if rr := (predictions{o.s}).result(req.ID); rr != nil {
		rr.PredictedTTFT = bestEst
	}
	return &scheduling.ProfileResult{Targets: []*endpoints.Endpoint{scored[best].Endpoint}}
}

// oracleChoice is what the oracle assumed about the request it routed,
// kept until the request's first token.
type oracleChoice struct {
	uncached int
	hashes   []uint64
}

// estimateTTFT prices the replica's prefill backlog plus this request's
// uncached tokens in full-budget chunks, each chunk sharing its step with
// the running decodes, as the engine's scheduler would run them.
func (s *sim) estimateTTFT(r *replica, uncached int) time.Duration {
	cfg := r.eng.Config()
	m := r.eng.Metrics()
	decodes := min(m.Running, cfg.MaxNumSeqs)
	chunk := max(1, cfg.MaxNumBatchedTokens-decodes)
	work := r.backlog + uncached
	full, rest := work/chunk, work%chunk
	step := func(n int) time.Duration {
		return cfg.Timing.StepDuration(engine.Shape{
			PrefillTokens: n, DecodeSeqs: decodes, SampledSeqs: decodes + 1,
			ContextTokens: n + decodes, AttentionPairs: float64(n) * float64(n+1) / 2,
		})
	}
	est := time.Duration(full) * step(chunk)
	if rest > 0 {
		est += step(rest)
	}
	return est
}

var _ scheduling.Picker = (*oracle)(nil)
