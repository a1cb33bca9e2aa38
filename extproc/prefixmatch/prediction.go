package prefixmatch

import (
	"sync"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// MatchKey is the cycle-state key under which a prefix scorer, as a data
// producer, leaves its *Prediction: the prompt tokens each candidate is
// expected to hold, which the live load model and the latency predictor
// turn into uncached prefill work. Both prefix scorers write it, through
// Publish.
var MatchKey = scheduling.NewKey[*Prediction]("prefix-match")

// Publish offers p as the request's match. With both prefix scorers
// configured, an exact match (the precise scorer's: real tokens, the
// servers' own cache contents) beats an approximate one whichever produced
// first, and a match that knows nothing of the prompt (no prompt it could
// hash) never replaces one that does.
func Publish(cs *scheduling.CycleState, p *Prediction) {
	if p.PromptTokens == 0 {
		return
	}
	if cur, ok := scheduling.Read(cs, MatchKey); ok && cur.Exact && !p.Exact {
		return
	}
	scheduling.Write(cs, MatchKey, p)
}

// Prediction is what a prefix scorer expects for one request, kept in the
// cycle state: the blocks each candidate holds (when produced), what it then
// predicted for the chosen endpoint (PreRequest), checked against the
// server's reported cached tokens (ResponseComplete).
type Prediction struct {
	// BlockTokens converts blocks into tokens; PromptTokens is the prompt's
	// length.
	BlockTokens  int
	PromptTokens int
	// Exact is set when PromptTokens is the prompt as the model server
	// tokenizes it (the precise scorer); otherwise it counts whole blocks
	// of an estimate.
	Exact bool
	// candidates are the endpoints the match was computed over and held[i]
	// the (tier-weighted, so possibly fractional) blocks candidates[i]
	// holds. Slices, not a map: written once per candidate on the hot path
	// and read in candidate order.
	candidates []*endpoints.Endpoint
	held       []float64
	// holds is set once some candidate's held is not zero: a consumer
	// reading every candidate's skips the reads of a prompt nobody holds.
	holds     bool
	box       *[]float64 // held's pool box, nil for a new array
	predicted int
}

// Prompt is the prompt's length in tokens given the picker's estimate: the
// match's own count when it is exact (a text prompt's estimate from its
// length can be far off, and uncached work is prompt minus held tokens).
func (p *Prediction) Prompt(estimate int) int {
	if p.Exact && p.PromptTokens > 0 {
		return p.PromptTokens
	}
	return max(estimate, p.PromptTokens)
}

// Uncached is the prompt tokens a server holding held of them must compute:
// at least one, since the engine always computes the last prompt token (an
// empty prompt costs nothing).
func Uncached(prompt, held int) int { return max(min(1, prompt), prompt-held) }

// Reset starts a match over candidates, every one holding nothing.
func (p *Prediction) Reset(candidates []*endpoints.Endpoint) {
	p.candidates, p.holds = candidates, false
	if p.held == nil {
		if h, ok := heldPool.Get().(*[]float64); ok {
			p.held, p.box = *h, h
		}
	}
	p.held = scheduling.Resized(p.held, len(candidates))
}

// heldPool recycles the per-candidate arrays: one per request otherwise,
// a kilobyte or more on a large pool. Each array travels in its own box
// (Prediction.box), so that putting it back allocates none.
var heldPool sync.Pool

// Done ends the per-candidate part of the match once the decision is made
// (the prefix scorer's PreRequest, after Predict): what each candidate held
// is no longer needed, only the prediction for the chosen one, so the
// array goes back to a pool. Later HeldTokensOf calls return 0.
func (p *Prediction) Done() {
	if p.held == nil {
		return
	}
	if p.box == nil {
		p.box = new([]float64)
	}
	*p.box = p.held[:0]
	heldPool.Put(p.box)
	p.held, p.box, p.candidates = nil, nil, nil
}

// Matched records that candidates[i] holds blocks of the prompt.
func (p *Prediction) Matched(i int, blocks float64) {
	p.held[i] = blocks
	p.holds = p.holds || blocks != 0
}

// Holds reports whether some candidate holds blocks of the prompt; when
// not, HeldTokens and HeldTokensOf are 0 for every candidate.
func (p *Prediction) Holds() bool { return p.holds }

// Candidates are the endpoints of the match, in the producer's order.
func (p *Prediction) Candidates() []*endpoints.Endpoint { return p.candidates }

// HeldBlocks is what candidates[i] holds, in blocks.
func (p *Prediction) HeldBlocks(i int) float64 { return p.held[i] }

// HeldTokens is what candidates[i] holds, in prompt tokens.
func (p *Prediction) HeldTokens(i int) int {
	return min(p.PromptTokens, int(p.held[i]*float64(p.BlockTokens)))
}

// HeldTokensOf is what endpoint e holds, 0 when it was not a candidate.
func (p *Prediction) HeldTokensOf(e *endpoints.Endpoint) int {
	for i, c := range p.candidates {
		if c == e {
			return p.HeldTokens(i)
		}
	}
	return 0
}

// ScoreSubset sets scores[i] to the held fraction of the prompt for eps[i].
// eps is the candidates after filtering: a subsequence of the match's
// candidates in the same order (filters keep order), so one merge pass
// pairs them up; an endpoint the match never saw scores 0.
func (p *Prediction) ScoreSubset(eps []*endpoints.Endpoint, scores []float64, totalBlocks int) {
	if totalBlocks <= 0 {
		return
	}
	clear(scores[:len(eps)])
	scheduling.AlignSubset(p.candidates, eps, func(i, k int) {
		scores[i] = p.held[k] / float64(totalBlocks)
	})
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
	for i, c := range p.candidates {
		if c == target {
			p.predicted = int(p.held[i] * float64(p.BlockTokens))
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

// Producer gives a prefix scorer its data-producer declaration: it
// produces MatchKey from nothing.
type Producer struct{}

// Produces implements scheduling.DataDependencies.
func (Producer) Produces() []string { return []string{MatchKey.String()} }

// Consumes implements scheduling.DataDependencies.
func (Producer) Consumes() []string { return nil }

// Match is one producer's match for a request: the prediction and the
// prompt's length in blocks (the denominator of the match ratio). The zero
// Match is "nothing to match" (no prompt).
type Match struct {
	Prediction *Prediction
	Blocks     int
}

// Hit reports whether any of eps (a subsequence of the match's candidates)
// holds a block of the prompt.
func (m Match) Hit(eps []*endpoints.Endpoint) bool {
	if m.Prediction == nil || m.Blocks <= 0 {
		return false
	}
	hit := false
	scheduling.AlignSubset(m.Prediction.candidates, eps, func(_, k int) {
		if m.Prediction.held[k] > 0 {
			hit = true
		}
	})
	return hit
}

// Source is a plugin whose per-request prefix match other plugins read by
// its configured name (llm-d's prefixMatchInfoProducerName): the prefix
// scorers and the prefix producers.
type Source interface {
	scheduling.Plugin
	// MatchOf is the request's match; false before it was produced.
	MatchOf(cs *scheduling.CycleState) (Match, bool)
}

// ResolveSource finds the configured plugin name as a Source; param names
// the parameter that named it, for the error.
func ResolveSource(lookup func(string) (scheduling.Plugin, bool), param, name string) (Source, error) {
	return scheduling.LookupAs[Source](lookup, param, name, "a prefix-match producer")
}

// TokensKey is where a token producer (token-producer) leaves the request's
// prompt as the model server tokenizes it; the precise matcher uses these
// tokens before tokenizing the prompt itself. They are the producers' and
// scorers' to read: the producer empties them at the decision (its
// PreRequest), so that a streaming response does not keep them.
var TokensKey = scheduling.NewKey[*[]int]("tokenized-prompt")

// Matcher is a prefix plugin's matching side: what it produces for a
// request, the hooks that keep its index, and its match.
type Matcher interface {
	Source
	scheduling.DataProducer
	scheduling.DataDependencies
	scheduling.PreRequest
	scheduling.ResponseComplete
	scheduling.EndpointsRemoved
}

// MatchProducer exposes a prefix scorer as llm-d's producer plugins do: the same
// matching and index upkeep, without scoring (a prefix-cache-scorer reads
// the match). Embedding the interface hides every other method of the
// scorer, so the framework cannot find a Score to run.
type MatchProducer struct{ Matcher }
