// Package precise is the precise-prefix-cache-scorer: it scores endpoints by
// how much of the request's prompt their KV cache really holds, as told by
// the servers' own KV-cache events (extproc/kvevents → extproc/kvindex).
//
// The prompt is tokenized with the model's tokenizer (chat requests through
// the chat template, as vLLM does) and hashed into vLLM-identical block
// hashes (internal/kvhash, sha256_cbor; the LoRA adapter and cache_salt as
// extra keys). Score = tier-weighted leading blocks held / prompt blocks.
// Tokenization goes through a prefix cache, so a long shared system prompt
// is tokenized once, not on every request; its block hashes go through a
// cache of their own (kvhash.BlockCache, 256K tokens' worth) likewise.
//
// Parameters:
//
//	tokenizer: string       tokenizer.json, or the folder holding it (required
//	                        unless every request sends token ids)
//	blockSize: int          the servers' --block-size (default 16)
//	hashSeed: string        the servers' PYTHONHASHSEED (default "42", as
//	                        kvgate sim and llm-d's examples use)
//	hashAlgo: string        the servers' --prefix-caching-hash-algo; only
//	                        sha256_cbor (the default) is supported
//	maxBlocksToMatch: int   leading blocks looked up (default 8192)
//	prefixCacheBytes: int   memory for cached tokenizations (default 64 MiB)
//	denseBlocks: int        leading blocks matched exactly; beyond them a
//	                        thinning sample is matched (default 256, as the
//	                        wasm filter; see internal/hints)
//	speculativeIndexing: bool  count the prefix blocks of requests routed to
//	                        an endpoint, until their response ends, as held
//	                        there (default false, as llm-d; kvgate's precise
//	                        policy turns it on)
//	maxSpeculativeEntries: int  bound on those entries (default 1048576)
//	tokenProcessorConfig: object  llm-d's layout: blockSize or
//	                        blockSizeTokens, hashSeed (hashAlgorithm refused)
//	indexerConfig: object   llm-d's layout: tokenProcessorConfig,
//	                        kvBlockIndexConfig{inMemoryConfig, enableMetrics,
//	                        maxPrefixBlocksToMatch}
//	kvEventsConfig: object  llm-d's layout: zmqEndpoint (a socket the picker
//	                        binds), topicFilter (kv@), concurrency,
//	                        engineType (vllm), discoverPods (default true)
//	                        and podDiscoveryConfig{socketPort (5557),
//	                        replaySocketPort}: subscribe to every endpoint's
//	                        own publisher
//	speculativeTTL: duration  refused: speculative entries last until the
//	                        response ends
//
// Any of llm-d's three objects selects llm-d's defaults for KV events:
// each endpoint's publisher at tcp://<ip>:5557, as llm-d's pod discovery.
// Unlike llm-d's, kvgate's index keeps the servers' own vLLM block hashes,
// so the block size and hash seed must be the servers' (see above).
//
// On kvgate's headers-only path the wasm filter (precise mode) has already
// tokenized and hashed the prompt; the scorer matches the x-kvgate-prefix
// sample when its block size and seed agree, exactly as it matches a body.
// The filter cannot tell a LoRA adapter from a base model, so adapter
// requests are matched precisely only on the body path.
//
// The KV index is the service "kvindex" of the plugin handle.
package precise

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/prompt"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// Type is the registered plugin type.
const Type = "precise-prefix-cache-scorer"

// ServiceKVIndex is the handle service key of the shared *kvindex.Index.
// Offer the index with WithKVIndex rather than under this key by hand: the
// scorer finds it only if the key and the type both match, and the two
// functions keep them together.
const ServiceKVIndex = "kvindex"

// WithKVIndex offers idx to the precise scorer in a Handle's services,
// which it returns (a new map when services is nil).
func WithKVIndex(services map[string]any, idx *kvindex.Index) map[string]any {
	if services == nil {
		services = map[string]any{}
	}
	services[ServiceKVIndex] = idx
	return services
}

// KVIndexFrom returns the index offered with WithKVIndex.
func KVIndexFrom(h *scheduling.Handle) (*kvindex.Index, bool) {
	return scheduling.Service[*kvindex.Index](h, ServiceKVIndex)
}

// blockCacheTokens sizes the cache of block hashes (kvhash.BlockCache):
// the tokens of recently hashed blocks it holds, about 2 MB. Prompts that
// share a prefix (a system prompt, a conversation's earlier turns) hash
// its blocks once instead of on every request.
const blockCacheTokens = 1 << 18

// Defaults.
const (
	DefaultMaxBlocksToMatch = 8192
	DefaultPrefixCacheBytes = 64 << 20
	DefaultMaxSpeculative   = 1 << 20
	HashAlgoSHA256CBOR      = "sha256_cbor"
)

// Params are the plugin's parameters.
type Params struct {
	Tokenizer        string `json:"tokenizer"`
	BlockSize        int    `json:"blockSize"`
	HashSeed         string `json:"hashSeed"`
	HashAlgo         string `json:"hashAlgo"`
	MaxBlocksToMatch int    `json:"maxBlocksToMatch"`
	PrefixCacheBytes int    `json:"prefixCacheBytes"`
	DenseBlocks      int    `json:"denseBlocks"`
	// SpeculativeIndexing and MaxSpeculativeEntries: see the package doc.
	SpeculativeIndexing   bool `json:"speculativeIndexing"`
	MaxSpeculativeEntries int  `json:"maxSpeculativeEntries"`
	// llm-d's layout (llmd.go).
	TokenProcessorConfig *TokenProcessorConfig `json:"tokenProcessorConfig"`
	IndexerConfig        *IndexerConfig        `json:"indexerConfig"`
	KVEventsConfig       *KVEventsConfig       `json:"kvEventsConfig"`
	// SpeculativeTTL is llm-d's lifetime of speculative entries, refused:
	// kvgate's last until the request's response ends.
	SpeculativeTTL json.RawMessage `json:"speculativeTTL"`

	// logEvery is indexerConfig.kvBlockIndexConfig.metricsLoggingInterval
	// when enableMetrics is on.
	logEvery time.Duration
}

// Prompt is what the scorer computed for a request.
type Prompt struct {
	Tokens int
	// MatchedBlocks is the longest match among the candidates, in blocks.
	MatchedBlocks int
	prediction    prefixmatch.Prediction
	prefix        *hints.Prefix
	// speculated is where PreRequest recorded the sample as pending; ""
	// when it did not (or it was released).
	speculated string
	hashes     []uint64
	// owner made the prompt and takes it back (Recycle); hashing holds a
	// prefix hashed from the body until the decision (nil after it).
	owner   *Scorer
	hashing *prefixmatch.Hashing
}

// Recycle implements scheduling.Recycler: the request has ended, so its
// speculative entries go (ResponseComplete has normally withdrawn them)
// and the prompt's buffers serve the next request.
func (p *Prompt) Recycle() {
	s := p.owner
	s.release(p)
	p.prediction.Done()
	p.decided()
	*p = Prompt{owner: s, hashes: p.hashes[:0]}
	s.prompts.Put(p)
}

// decided releases what only the decision reads: the prefix's blocks,
// sample and hashes (p.hashes keep the ones a speculative entry needs).
func (p *Prompt) decided() {
	p.prefix = nil
	if p.hashing != nil {
		p.hashing.Release()
		p.hashing = nil
	}
}

// Scorer implements precise-prefix-cache-scorer.
type Scorer struct {
	scheduling.Named
	prefixmatch.Producer
	params   Params
	index    *kvindex.Index
	recorder prefixmatch.Recorder
	// seedID identifies the hash seed in the filter's prefix header: the
	// event value of vLLM's NONE_HASH.
	seedID  uint64
	key     scheduling.Key[*Prompt]
	tok     *tokenizer.Tokenizer
	cache   *tokenizer.PrefixCache
	hasher  *kvhash.Hasher // shared by every request: it keeps no per-call state
	scratch sync.Pool      // *scratch
	prompts sync.Pool      // *Prompt, recycled when its request ends
	pending *pending       // nil unless speculativeIndexing
	sets    *candidateSets
	// kvEvents is what llm-d's kvEventsConfig asks the picker for.
	kvEvents KVEvents
}

type scratch struct {
	set     candidateSet      // the candidates when no kept set is theirs
	pending pendingCandidates // a stale set's speculative ids resolved again
	runs    []int
	weights []float64
}

// DecodeParams decodes the parameters strictly over their defaults.
func DecodeParams(raw json.RawMessage) (Params, error) {
	p := Params{BlockSize: kvhash.DefaultBlockSize, HashSeed: kvhash.DefaultSeed, HashAlgo: HashAlgoSHA256CBOR, MaxBlocksToMatch: DefaultMaxBlocksToMatch, PrefixCacheBytes: DefaultPrefixCacheBytes, DenseBlocks: prefixmatch.DefaultDenseBlocks, MaxSpeculativeEntries: DefaultMaxSpeculative}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return Params{}, err
	}
	return p, nil
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p, err := DecodeParams(raw)
	if err != nil {
		return nil, err
	}
	return NewWithParams(Type, name, p, h)
}

// NewWithParams builds the precise matcher of type typ from decoded
// parameters (precise-prefix-cache-producer wraps it).
func NewWithParams(typ, name string, p Params, h *scheduling.Handle) (*Scorer, error) {
	if err := scheduling.RefuseSet("speculative entries last until the request's response ends", map[string]json.RawMessage{"speculativeTTL": p.SpeculativeTTL}); err != nil {
		return nil, err
	}
	kvEvents, err := p.applyLLMD()
	if err != nil {
		return nil, err
	}
	if p.HashAlgo != HashAlgoSHA256CBOR {
		return nil, fmt.Errorf("parameters.hashAlgo: only %q is supported, got %q", HashAlgoSHA256CBOR, p.HashAlgo)
	}
	if p.MaxBlocksToMatch <= 0 || p.PrefixCacheBytes <= 0 || p.DenseBlocks <= 0 || p.DenseBlocks > hints.MaxDense || p.MaxSpeculativeEntries <= 0 {
		return nil, fmt.Errorf("parameters.maxBlocksToMatch, prefixCacheBytes and maxSpeculativeEntries must be positive, denseBlocks in [1, %d]", hints.MaxDense)
	}
	hasher, err := kvhash.New(p.HashSeed, p.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("parameters.blockSize: %w", err)
	}
	index, ok := KVIndexFrom(h)
	if !ok {
		return nil, fmt.Errorf("%s needs the KV-event index: run the picker with KV events enabled (--kv-events-addr or kvEvents endpoints)", Type)
	}
	s := &Scorer{Named: scheduling.NewNamed(typ, name), params: p, index: index, recorder: prefixmatch.RecorderOf(h),
		seedID: kvhash.NoneHash(p.HashSeed).Uint64(), kvEvents: kvEvents, sets: newCandidateSets()}
	s.key = scheduling.NewKey[*Prompt](s.TypedName().String())
	if p.Tokenizer != "" {
		dir := p.Tokenizer
		if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
			dir = filepath.Dir(dir)
		}
		t, err := tokenizer.Load(dir)
		if err != nil {
			return nil, fmt.Errorf("parameters.tokenizer: %w", err)
		}
		s.tok = t
		s.cache = tokenizer.NewPrefixCache(t, p.PrefixCacheBytes)
	}
	// The block size was validated above.
	blocks, _ := kvhash.NewBlockCache(p.BlockSize, blockCacheTokens/p.BlockSize)
	_ = hasher.UseCache(blocks) // made for its block size
	s.hasher = hasher
	s.scratch.New = func() any { return new(scratch) }
	s.prompts.New = func() any { return &Prompt{owner: s} }
	if p.SpeculativeIndexing {
		s.pending = newPending(p.MaxSpeculativeEntries)
	}
	return s, nil
}

// StateKey is where Score leaves the request's *Prompt for later stages;
// per instance, since two instances may hash differently.
func (s *Scorer) StateKey() scheduling.Key[*Prompt] { return s.key }

// Tokens returns the request's prompt token ids as the model server computes
// them, at most the maxBlocksToMatch blocks the scorer hashes: tokens past
// them cannot change the match, so a prompt of megabytes is not tokenized
// whole (it is longer than any model's context anyway, and its server will
// refuse it). An error when they cannot be known.
func (s *Scorer) Tokens(req *scheduling.Request) ([]int, error) {
	if req.Body == nil {
		return nil, fmt.Errorf("request has no body")
	}
	if len(req.Body.PromptTokenIDs) == 0 && s.tok == nil {
		return nil, fmt.Errorf("no tokenizer configured")
	}
	ids, _, err := prompt.TokensUpTo(s.cache, s.tok, req.Body, s.maxTokens())
	return ids, err
}

// maxTokens is how many prompt tokens the scorer's hashes can use.
func (s *Scorer) maxTokens() int { return s.params.MaxBlocksToMatch * s.params.BlockSize }

// Hashes returns the request's block hashes, at most maxBlocksToMatch.
// adapter is the LoRA adapter the request addresses ("" for the base
// model), an extra key of every block hash.
func (s *Scorer) Hashes(tokens []int, adapter, cacheSalt string) []uint64 {
	return s.hashes(tokens, kvhash.Extra{LoRA: adapter, CacheSalt: cacheSalt})
}

func (s *Scorer) hashes(tokens []int, extra kvhash.Extra) []uint64 {
	return s.appendHashes(make([]uint64, 0, min(len(tokens), s.maxTokens())/s.params.BlockSize), tokens, extra)
}

// appendHashes is hashes appending to dst.
func (s *Scorer) appendHashes(dst []uint64, tokens []int, extra kvhash.Extra) []uint64 {
	if n := s.maxTokens(); len(tokens) > n {
		tokens = tokens[:n]
	}
	return s.hasher.AppendUint64s(dst, tokens, extra)
}

// multimodal returns a chat prompt's tokens with its multimodal items'
// placeholders and the items, as the simulator renders them
// (prompt.TokensMM, prompt.DefaultTokensPerItem placeholders per item);
// ok is false for a prompt without multimodal parts.
func (s *Scorer) multimodal(req *scheduling.Request) (tokens []int, mm []kvhash.MMItem, ok bool, err error) {
	if s.tok == nil || len(prompt.MMParts(req.Body)) == 0 {
		return nil, nil, false, nil
	}
	tokens, mm, err = prompt.TokensMM(s.cache, s.tok, req.Body, prompt.DefaultTokensPerItem)
	return tokens, mm, true, err
}

// Prefix returns the request's prefix as a block sample, with its prompt
// length in tokens: hashed here from the body, or as the wasm filter sent
// it on the headers-only path (used only when it was hashed with this
// scorer's block size and seed). Both paths go through the same sampling,
// so they score alike. nil when nothing can be matched.
func (s *Scorer) Prefix(req *scheduling.Request, eps []*endpoints.Endpoint) (*hints.Prefix, int) {
	return s.prefixInto(new(prefixmatch.Hashing), req, eps)
}

// prefixInto is Prefix hashing into h.
func (s *Scorer) prefixInto(h *prefixmatch.Hashing, req *scheduling.Request, eps []*endpoints.Endpoint) (*hints.Prefix, int) {
	if req.Body == nil {
		if rp := req.Prefix; rp != nil && rp.Mode == hints.Precise && rp.BlockSize == s.params.BlockSize && rp.Seed == s.seedID && rp.Blocks > 0 {
			return rp, req.PromptTokens
		}
		return nil, 0
	}
	// Multimodal blocks carry their items' hashes (vLLM's extra keys).
	tokens, mm, isMM, err := s.multimodal(req)
	if !isMM {
		tokens, err = s.Tokens(req)
	}
	if err != nil {
		return nil, 0 // nothing is known to be cached
	}
	h.Blocks = s.appendHashes(h.Blocks[:0], tokens, kvhash.Extra{LoRA: adapterOf(req.TargetModel, eps), CacheSalt: req.Body.CacheSalt, MM: mm})
	return s.sample(h), len(tokens)
}

// sample is the block sample of h.Blocks, in h; nil when there are no
// blocks.
func (s *Scorer) sample(h *prefixmatch.Hashing) *hints.Prefix {
	return h.Sample(hints.Precise, s.params.BlockSize, s.seedID, s.params.DenseBlocks)
}

// Produce implements scheduling.DataProducer: the match over every
// candidate, once per request, for Score and for the live load model.
func (s *Scorer) Produce(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) {
	s.produce(cs, req, eps)
}

// Score implements scheduling.Scorer from the produced match; a scorer run
// on its own (outside a scheduler) produces it first.
func (s *Scorer) Score(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	p, ok := scheduling.Read(cs, s.key)
	if !ok {
		p = s.produce(cs, req, eps)
	}
	if p.prefix != nil {
		p.prediction.ScoreSubset(eps, scores, p.prefix.Blocks)
	}
}

// Consumes implements scheduling.DataDependencies: a token producer's
// tokens, when one is configured, are read.
func (s *Scorer) Consumes() []string { return []string{prefixmatch.TokensKey.String()} }

// prefixOf is Prefix into h, from a token producer's tokens when it left
// them.
func (s *Scorer) prefixOf(h *prefixmatch.Hashing, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) (*hints.Prefix, int) {
	toks, ok := scheduling.Read(cs, prefixmatch.TokensKey)
	if !ok || toks == nil || len(*toks) == 0 || req.Body == nil {
		return s.prefixInto(h, req, eps)
	}
	h.Blocks = s.appendHashes(h.Blocks[:0], *toks, kvhash.Extra{LoRA: adapterOf(req.TargetModel, eps), CacheSalt: req.Body.CacheSalt})
	return s.sample(h), len(*toks)
}

func (s *Scorer) produce(cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) *Prompt {
	p := s.prompts.Get().(*Prompt)
	p.hashing = prefixmatch.AcquireHashing()
	prefix, tokens := s.prefixOf(p.hashing, cs, req, eps)
	p.Tokens, p.prefix = tokens, prefix
	p.prediction = prefixmatch.Prediction{BlockTokens: s.params.BlockSize, PromptTokens: tokens, Exact: tokens > 0}
	p.prediction.Reset(eps)
	scheduling.Write(cs, s.key, p)
	prefixmatch.Publish(cs, &p.prediction)
	if prefix == nil {
		return p
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	hashes := prefixmatch.SampleHashes(p.hashing.Hashes[:0], prefix)
	p.hashing.Hashes = hashes
	set := s.sets.get(s.index, s.pending, eps, &sc.set)
	if cap(sc.runs) < len(eps) {
		sc.runs = make([]int, len(eps))
	}
	sc.runs = sc.runs[:len(eps)]
	if cap(sc.weights) < len(eps) {
		sc.weights = make([]float64, len(eps))
	}
	sc.weights = sc.weights[:len(eps)]
	s.index.LookupCandidates(hashes, &set.index, sc.weights, sc.runs)
	if s.pending != nil {
		s.pending.extend(&set.pending, set.names, &sc.pending, hashes, sc.runs, sc.weights)
	}
	if set == &sc.set {
		clear(sc.set.names) // the pool keeps no endpoint's address
	}
	for i := range eps {
		runs, weighted := sc.runs[i], sc.weights[i]
		if runs == 0 {
			continue
		}
		// weighted is the tier-weighted count of matched samples; the
		// same weighting applies to the blocks they stand for.
		blocks := float64(prefixmatch.SampledMatch(prefix, runs)) * weighted / float64(runs)
		p.MatchedBlocks = max(p.MatchedBlocks, prefixmatch.SampledMatch(prefix, runs))
		p.prediction.Matched(i, blocks)
	}
	return p
}

// PreRequest implements scheduling.PreRequest: it records how many prompt
// tokens the chosen endpoint is expected to serve from its cache and, with
// speculative indexing, that the endpoint is now computing the prompt's
// blocks. The prompt keeps only what its response's end needs from here.
func (s *Scorer) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Result) {
	p, ok := scheduling.Read(cs, s.key)
	if !ok {
		return
	}
	target := p.prediction.Predict(res, s.recorder, s.TypedName())
	p.prediction.Done()
	if s.pending != nil && target != nil && p.prefix != nil {
		// Kept past the decision, which releases the matched ones.
		p.hashes = append(p.hashes[:0], p.hashing.Hashes...)
		if s.pending.add(target.Address(), p.hashes) {
			p.speculated = target.Address()
		}
	}
	p.decided()
}

// ResponseComplete implements scheduling.ResponseComplete: the server's
// reported cached tokens check the prediction.
func (s *Scorer) ResponseComplete(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Response) {
	if p, ok := scheduling.Read(cs, s.key); ok {
		s.release(p)
		p.prediction.Check(res, s.recorder, s.TypedName())
	}
}

// release withdraws a request's speculative entries, once.
func (s *Scorer) release(p *Prompt) {
	if p.speculated == "" {
		return
	}
	s.pending.remove(p.speculated, p.hashes)
	p.speculated, p.hashes = "", p.hashes[:0]
}

// EndpointsRemoved implements scheduling.EndpointsRemoved.
func (s *Scorer) EndpointsRemoved(addresses []string) {
	if s.pending == nil {
		return
	}
	for _, a := range addresses {
		s.pending.forget(a)
	}
}

// adapterOf reports whether target is a LoRA adapter rather than the base
// model: an adapter is what some server lists in vllm:lora_requests_info.
// vLLM keys adapter blocks by the adapter's name, so the hashes differ.
// Servers that list no adapter are passed over without reading their
// snapshots: this is the first look at every candidate in a decision.
func adapterOf(target string, eps []*endpoints.Endpoint) string {
	for _, e := range eps {
		if !e.ListsAdapters() {
			continue
		}
		m := e.Metrics()
		if _, ok := m.ActiveLoRAs[target]; ok {
			return target
		}
		if _, ok := m.WaitingLoRAs[target]; ok {
			return target
		}
	}
	return ""
}

// BlockSize is the configured block size in tokens.
func (s *Scorer) BlockSize() int { return s.params.BlockSize }

var (
	_ scheduling.Scorer           = (*Scorer)(nil)
	_ scheduling.DataProducer     = (*Scorer)(nil)
	_ scheduling.EndpointsRemoved = (*Scorer)(nil)
	_ scheduling.PreRequest       = (*Scorer)(nil)
	_ scheduling.ResponseComplete = (*Scorer)(nil)
)
