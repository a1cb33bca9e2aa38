// Package prefix is the approximate prefix-cache-scorer of GIE: without any
// feedback from the servers, it remembers which prompt prefixes it routed
// where and scores endpoints by how much of the request's prefix they were
// sent before. The prompt text is cut into blocks of blockSize × 4 bytes and
// hashed with chained xxhash64 (internal/prefixhash), seeded with the target
// model and cache_salt; chat requests hash the whole conversation so that
// every turn extends the previous turn's prefix. Prompts given as token ids
// are hashed as 4 bytes per token, so a block is blockSize/4 tokens as for
// text; so are the tokens a token-producer left (prefixmatch.TokensKey),
// instead of the text, as llm-d's approximate producer hashes them.
//
// Score = consecutive matched blocks from the start / total blocks (the
// match ratio); with llm-d's matchLengthWeight w > 0 it is
// w·min(1, matchedTokens/matchLengthScaleTokens)² + (1−w)·ratio, which
// favours long matches (attention cost grows with the prompt).
//
// With prefixMatchInfoProducerName the scorer hashes nothing itself: it
// scores the match of the named producer (approx-prefix-cache-producer,
// precise-prefix-cache-producer or a prefix scorer), as llm-d's
// producer/scorer split does, and the hashing parameters are refused.
// Without it the scorer is its own approximate producer, as GIE's is and
// as llm-d's is with its auto-created producer.
//
// Parameters (GIE's names, llm-d's hashBlockSize and scorer parameters):
//
//	blockSize: int               bytes of prompt text per block (default 64)
//	blockSizeTokens: int         tokens per block, × 4 bytes; overrides blockSize
//	hashBlockSize: int           llm-d's older name for blockSize; overrides it
//	maxPrefixBlocksToMatch: int  leading blocks hashed (default 256)
//	lruCapacityPerServer: int    blocks remembered per server (default 31250)
//	autoTune: bool               take the block size (tokens) and capacity from
//	                             the servers' vllm:cache_config_info when
//	                             reported (default true)
//	denseBlocks: int             leading blocks matched exactly; beyond them a
//	                             thinning sample is matched (default 256, as
//	                             the wasm filter; see internal/hints)
//	prefixMatchInfoProducerName: string  score this producer's match
//	matchLengthWeight: float     weight of the match length in the score, in
//	                             [0, 1] (default 0: the ratio only)
//	matchLengthScaleTokens: int  matched tokens that give the full length
//	                             score (default 8192)
//
// On kvgate's headers-only path the wasm filter has already hashed the
// prompt (x-kvgate-prefix); the scorer uses those hashes when they were made
// with its block size, and scores them exactly as it scores a body.
package prefix

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/prefixhash"
)

// Type is the registered plugin type.
const Type = "prefix-cache-scorer"

// Defaults, as in GIE.
const (
	DefaultBlockChars       = 64
	DefaultMaxPrefixBlocks  = 256
	DefaultLRUCapacity      = 31250
	maxSlotScratchEndpoints = 1 << 16
)

// Params are the plugin's parameters.
type Params struct {
	BlockSize              int   `json:"blockSize"`
	BlockSizeTokens        int   `json:"blockSizeTokens"`
	HashBlockSize          int   `json:"hashBlockSize"`
	MaxPrefixBlocksToMatch int   `json:"maxPrefixBlocksToMatch"`
	LRUCapacityPerServer   int   `json:"lruCapacityPerServer"`
	AutoTune               *bool `json:"autoTune"`
	DenseBlocks            int   `json:"denseBlocks"`
	// PrefixMatchInfoProducerName, MatchLengthWeight and
	// MatchLengthScaleTokens are llm-d's scorer parameters.
	PrefixMatchInfoProducerName string   `json:"prefixMatchInfoProducerName"`
	MatchLengthWeight           *float64 `json:"matchLengthWeight"`
	MatchLengthScaleTokens      int      `json:"matchLengthScaleTokens"`
}

// DefaultMatchLengthScaleTokens is llm-d's matchLengthScaleTokens default.
const DefaultMatchLengthScaleTokens = 8192

// lengthScore is llm-d's match scoring: the ratio, blended with the
// squared, capped match length when weight > 0.
type lengthScore struct {
	weight float64
	scale  int
}

func newLengthScore(p Params) (lengthScore, error) {
	l := lengthScore{scale: DefaultMatchLengthScaleTokens}
	if p.MatchLengthWeight != nil {
		l.weight = *p.MatchLengthWeight
	}
	if l.weight < 0 || l.weight > 1 {
		return l, fmt.Errorf("parameters.matchLengthWeight must be in [0, 1], got %v", l.weight)
	}
	if p.MatchLengthScaleTokens < 0 {
		return l, fmt.Errorf("parameters.matchLengthScaleTokens must be positive, got %d", p.MatchLengthScaleTokens)
	}
	if p.MatchLengthScaleTokens > 0 {
		l.scale = p.MatchLengthScaleTokens
	}
	return l, nil
}

// score sets scores[i] from m's match for eps[i].
func (l lengthScore) score(m prefixmatch.Match, eps []*endpoints.Endpoint, scores []float64) {
	if m.Prediction == nil || m.Blocks <= 0 {
		return
	}
	m.Prediction.ScoreSubset(eps, scores, m.Blocks)
	if l.weight == 0 {
		return
	}
	for i, ratio := range scores[:len(eps)] {
		tokens := ratio * float64(m.Blocks*m.Prediction.BlockTokens)
		length := min(1, tokens/float64(l.scale))
		scores[i] = l.weight*length*length + (1-l.weight)*ratio
	}
}

// Scorer implements prefix-cache-scorer; it is also a PreRequest hook (to
// record its routing) and drops the state of endpoints that leave the pool.
type Scorer struct {
	scheduling.Named
	prefixmatch.Producer
	params Params
	length lengthScore
	// maxTokens, when positive, bounds the hashed prefix in tokens
	// instead of params.MaxPrefixBlocksToMatch; minBlockTokens is the
	// smallest block size used (llm-d's producer clamps to 64 tokens).
	maxTokens, minBlockTokens int
	auto                      bool
	index                     *indexer
	recorder                  prefixmatch.Recorder
	key                       scheduling.Key[*hashed]
	scratch                   sync.Pool
	// states recycles the per-request *hashed with their buffers (see
	// hashed.Recycle).
	states sync.Pool
}

type scratch struct {
	names   []string
	matched []int
	slot    []int32
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{BlockSize: DefaultBlockChars, MaxPrefixBlocksToMatch: DefaultMaxPrefixBlocks, LRUCapacityPerServer: DefaultLRUCapacity, DenseBlocks: prefixmatch.DefaultDenseBlocks}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.PrefixMatchInfoProducerName != "" {
		return newFromProducer(name, p, raw)
	}
	return NewMatcher(Type, name, p, h)
}

// NewMatcher builds the approximate matcher of type typ (prefix-cache-scorer,
// or approx-prefix-cache-producer, which wraps it) from p, whose zero
// fields other than the defaults New fills are errors.
func NewMatcher(typ, name string, p Params, h *scheduling.Handle) (*Scorer, error) {
	for field, v := range map[string]int{"blockSize": p.BlockSize, "blockSizeTokens": p.BlockSizeTokens, "hashBlockSize": p.HashBlockSize, "maxPrefixBlocksToMatch": p.MaxPrefixBlocksToMatch, "lruCapacityPerServer": p.LRUCapacityPerServer, "denseBlocks": p.DenseBlocks} {
		if v < 0 || (v == 0 && field != "blockSizeTokens" && field != "hashBlockSize") {
			return nil, fmt.Errorf("parameters.%s must be positive, got %d", field, v)
		}
	}
	switch {
	case p.BlockSizeTokens > 0:
		p.BlockSize = p.BlockSizeTokens * prefixhash.CharsPerToken
	case p.HashBlockSize > 0:
		p.BlockSize = p.HashBlockSize
	}
	length, err := newLengthScore(p)
	if err != nil {
		return nil, err
	}
	s := &Scorer{
		Named:    scheduling.NewNamed(typ, name),
		length:   length,
		params:   p,
		auto:     p.AutoTune == nil || *p.AutoTune,
		index:    newIndexer(),
		recorder: prefixmatch.RecorderOf(h),
	}
	// A key per instance: two configured instances (one per profile, say)
	// hash differently and must not read each other's state.
	s.key = scheduling.NewKey[*hashed](s.TypedName().String())
	s.scratch.New = func() any { return new(scratch) }
	s.states.New = func() any { return &hashed{pool: &s.states} }
	return s, nil
}

// hashed is what Score leaves in the cycle state for PreRequest.
type hashed struct {
	// prefix is the request's block sample; nil without a prompt (and
	// after the decision).
	prefix     *hints.Prefix
	prediction prefixmatch.Prediction
	// pool is the scorer's; hashing holds a prefix hashed from the body
	// and the sample's hashes, matched in Score and recorded in
	// PreRequest, until the decision (nil after it).
	pool    *sync.Pool
	hashing *prefixmatch.Hashing
}

// Recycle implements scheduling.Recycler: the request has ended.
func (st *hashed) Recycle() {
	st.prediction.Done()
	st.prediction = prefixmatch.Prediction{}
	st.decided()
	st.pool.Put(st)
}

// decided releases what only the decision reads: the prefix's blocks,
// sample and hashes.
func (st *hashed) decided() {
	st.prefix = nil
	if st.hashing != nil {
		st.hashing.Release()
		st.hashing = nil
	}
}

// SetTokenBounds makes the matcher hash at most maxTokens tokens (0: the
// block bound applies) in blocks of at least minBlockTokens tokens: llm-d's
// approx-prefix-cache-producer semantics.
func (s *Scorer) SetTokenBounds(maxTokens, minBlockTokens int) {
	s.maxTokens, s.minBlockTokens = maxTokens, minBlockTokens
}

// blockChars is the configured block size in bytes, or, when auto-tuning,
// the servers' own block size in tokens × 4: the size most candidates
// report (the smaller on a tie), so that the order of the candidates, or
// one odd server among them, does not change how a prompt is hashed; never
// below the minimum block size.
func (s *Scorer) blockChars(eps []*endpoints.Endpoint) int {
	chars := s.params.BlockSize
	if s.auto {
		if bs := commonBlockSize(eps); bs > 0 {
			chars = bs * prefixhash.CharsPerToken
		}
	}
	return max(chars, s.minBlockTokens*prefixhash.CharsPerToken)
}

// maxBlocks bounds the hashed prefix for blocks of blockChars.
func (s *Scorer) maxBlocks(blockChars int) int {
	if s.maxTokens > 0 {
		return max(1, s.maxTokens/max(1, blockChars/prefixhash.CharsPerToken))
	}
	return s.params.MaxPrefixBlocksToMatch
}

// commonBlockSize is the block size most of eps report (the smaller on a
// tie), 0 when none does. A pool has few distinct sizes; past the first
// eight the rest are not counted.
func commonBlockSize(eps []*endpoints.Endpoint) int {
	var sizes, counts [8]int
	n := 0
	for _, e := range eps {
		bs := e.Metrics().BlockSize
		if bs <= 0 {
			continue
		}
		i := 0
		for i < n && sizes[i] != bs {
			i++
		}
		if i == n {
			if n == len(sizes) {
				continue
			}
			sizes[n] = bs
			n++
		}
		counts[i]++
	}
	best := 0
	for i := 1; i < n; i++ {
		if counts[i] > counts[best] || (counts[i] == counts[best] && sizes[i] < sizes[best]) {
			best = i
		}
	}
	if n == 0 {
		return 0
	}
	return sizes[best]
}

func (s *Scorer) capacity(e *endpoints.Endpoint) int {
	if s.auto {
		if n := e.Metrics().NumGPUBlocks; n > 0 {
			return n
		}
	}
	return s.params.LRUCapacityPerServer
}

// prefix returns the request's prefix as a block sample: hashed here from
// the body (into h; from tokens when a token producer left them), or as
// the wasm filter sent it on the headers-only path (used only when it was
// hashed with this scorer's block size). Both paths go through the same
// sampling, so they score alike. nil when there is nothing to match.
func (s *Scorer) prefix(h *prefixmatch.Hashing, req *scheduling.Request, tokens *[]int, blockChars int) *hints.Prefix {
	blockTokens := max(1, blockChars/prefixhash.CharsPerToken)
	switch {
	case req.Body != nil:
		var seed uint64
		hp := prefixhash.Params{BlockChars: blockChars, MaxBlocks: s.maxBlocks(blockChars)}
		if tokens != nil {
			// The token producer's tokens (real or estimated), 4 bytes
			// each as for token-id prompts, as llm-d's approximate
			// producer hashes token-producer's output.
			seed = prefixhash.Seed(req.Body.Model, req.Body.CacheSalt)
			h.Blocks = prefixhash.AppendBlocks(h.Blocks[:0], hp, seed, prefixhash.TokenText(*tokens))
		} else {
			seed, h.Blocks = prefixhash.AppendRequest(h.Blocks[:0], hp, req.Body)
		}
		return h.Sample(hints.Approximate, blockTokens, seed, s.params.DenseBlocks)
	case req.Prefix != nil && req.Prefix.Mode == hints.Approximate && req.Prefix.BlockSize*prefixhash.CharsPerToken == blockChars && req.Prefix.Blocks > 0:
		return req.Prefix
	}
	return nil
}

// Consumes implements scheduling.DataDependencies: a token producer runs
// first.
func (s *Scorer) Consumes() []string { return []string{prefixmatch.TokensKey.String()} }

// Produce implements scheduling.DataProducer: the match over every
// candidate, once per request, for Score and for the live load model.
func (s *Scorer) Produce(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) {
	s.produce(cs, req, eps)
}

// Score implements scheduling.Scorer from the produced match; a scorer run
// on its own (outside a scheduler) produces it first.
func (s *Scorer) Score(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	st, ok := scheduling.Read(cs, s.key)
	if !ok {
		st = s.produce(cs, req, eps)
	}
	s.length.score(st.match(), eps, scores)
}

func (st *hashed) match() prefixmatch.Match {
	if st.prefix == nil {
		return prefixmatch.Match{}
	}
	return prefixmatch.Match{Prediction: &st.prediction, Blocks: st.prefix.Blocks}
}

// MatchOf implements prefixmatch.Source: the request's match, once
// produced.
func (s *Scorer) MatchOf(cs *scheduling.CycleState) (prefixmatch.Match, bool) {
	st, ok := scheduling.Read(cs, s.key)
	if !ok {
		return prefixmatch.Match{}, false
	}
	return st.match(), true
}

func (s *Scorer) produce(cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) *hashed {
	chars := s.blockChars(eps)
	tokens, _ := scheduling.Read(cs, prefixmatch.TokensKey)
	st := s.states.Get().(*hashed)
	st.hashing = prefixmatch.AcquireHashing()
	p := s.prefix(st.hashing, req, tokens, chars)
	st.prefix, st.prediction = p, prefixmatch.Prediction{BlockTokens: max(1, chars/prefixhash.CharsPerToken)}
	st.prediction.Reset(eps)
	if p != nil {
		st.prediction.PromptTokens = p.Blocks * st.prediction.BlockTokens
	}
	scheduling.Write(cs, s.key, st)
	prefixmatch.Publish(cs, &st.prediction)
	if p == nil {
		return st
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	hashes := prefixmatch.SampleHashes(st.hashing.Hashes[:0], p)
	st.hashing.Hashes = hashes
	sc.names = sc.names[:0]
	for _, e := range eps {
		sc.names = append(sc.names, e.Address())
	}
	if cap(sc.matched) < len(eps) {
		sc.matched = make([]int, len(eps))
	}
	sc.matched = sc.matched[:len(eps)]
	sc.slot = s.index.match(hashes, sc.names, sc.matched, sc.slot)
	if cap(sc.slot) > maxSlotScratchEndpoints {
		sc.slot = nil
	}
	clear(sc.names)
	for i, runs := range sc.matched {
		st.prediction.Matched(i, float64(prefixmatch.SampledMatch(p, runs)))
	}
	return st
}

// PreRequest implements scheduling.PreRequest: the primary target will now
// hold this prompt's blocks.
func (s *Scorer) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Result) {
	st, ok := scheduling.Read(cs, s.key)
	if !ok {
		return
	}
	target := st.prediction.Predict(res, s.recorder, s.TypedName())
	st.prediction.Done()
	if target != nil && st.prefix != nil {
		s.index.add(target.Address(), st.hashing.Hashes, s.capacity(target))
	}
	st.decided()
}

// ResponseComplete implements scheduling.ResponseComplete: the server's
// reported cached tokens check the prediction.
func (s *Scorer) ResponseComplete(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Response) {
	if st, ok := scheduling.Read(cs, s.key); ok {
		st.prediction.Check(res, s.recorder, s.TypedName())
	}
}

// EndpointsRemoved implements scheduling.EndpointsRemoved.
func (s *Scorer) EndpointsRemoved(addresses []string) {
	for _, a := range addresses {
		s.index.remove(a)
	}
}

// IndexSize is the number of (block, server) entries remembered.
func (s *Scorer) IndexSize() int { return s.index.size() }

var (
	_ prefixmatch.Source          = (*Scorer)(nil)
	_ scheduling.Scorer           = (*Scorer)(nil)
	_ scheduling.DataProducer     = (*Scorer)(nil)
	_ scheduling.PreRequest       = (*Scorer)(nil)
	_ scheduling.EndpointsRemoved = (*Scorer)(nil)
	_ scheduling.ResponseComplete = (*Scorer)(nil)
)
