package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/prompt"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// vmConfig is the VM configuration (Envoy: vm_config.configuration): the
// model's tokenizer files, which precise mode needs and which a wasm VM
// cannot read from disk. It is the only place large enough for them that
// is read once per VM rather than once per plugin.
type vmConfig struct {
	// Tokenizer is the model's tokenizer.json, TokenizerConfig its
	// tokenizer_config.json (for the chat template).
	Tokenizer       json.RawMessage `json:"tokenizer"`
	TokenizerConfig json.RawMessage `json:"tokenizerConfig"`
}

// loadTokenizer builds the tokenizer from a VM configuration; an empty
// configuration means none (approximate mode needs none).
func loadTokenizer(data []byte) (*tokenizer.Tokenizer, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil
	}
	var c vmConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("VM configuration: %w", err)
	}
	if len(c.Tokenizer) == 0 {
		return nil, errors.New("VM configuration: no tokenizer")
	}
	return tokenizer.LoadFromBytes(c.Tokenizer, c.TokenizerConfig)
}

// prefixCacheBytes bounds the tokenizer's per-VM prefix cache: agents
// resend growing conversations, and re-tokenizing only the new tail keeps
// precise mode's cost proportional to what changed.
const prefixCacheBytes = 8 << 20

// precise reproduces vLLM's block hashes (sha256_cbor): the prompt is
// rendered and tokenized as vLLM does, and the token blocks are hashed
// with vLLM's PYTHONHASHSEED. A VM runs one callback at a time, so the
// Hasher's and cache's single-goroutine rules hold.
type precise struct {
	tok *tokenizer.Tokenizer
	// enc encodes the prompt: the tokenizer's prefix cache.
	enc       prompt.Encoder
	hasher    *kvhash.Hasher
	seedID    uint64
	blockSize int
	maxBlocks int
	dense     int
}

func newPrecise(c config, tok *tokenizer.Tokenizer) (*precise, error) {
	if tok == nil {
		return nil, fmt.Errorf("precise mode needs the tokenizer in the VM configuration: %w", errModeUnavailable)
	}
	if c.HashSeed == "" {
		return nil, errors.New("precise mode needs hashSeed (the model servers' PYTHONHASHSEED)")
	}
	h, err := kvhash.New(c.HashSeed, c.BlockSize)
	if err != nil {
		return nil, err
	}
	return &precise{
		tok:       tok,
		enc:       tokenizer.NewPrefixCache(tok, prefixCacheBytes),
		hasher:    h,
		seedID:    h.None().Uint64(),
		blockSize: c.BlockSize,
		maxBlocks: c.MaxPrefixBlocks,
		dense:     c.DenseBlocks,
	}, nil
}

// hash tokenizes no more of the prompt than its hashed blocks need
// (maxPrefixBlocks × blockSize tokens): a VM callback cannot be
// interrupted, so a prompt of megabytes must cost no more than one that
// fills the blocks. The prompt length is then the known lower bound or the
// text-length estimate, whichever is larger.
func (p *precise) hash(r *openai.Request) (hints.Prefix, int, error) {
	limit := p.maxBlocks * p.blockSize
	ids, truncated, err := prompt.TokensUpTo(p.enc, p.tok, r, limit)
	if err != nil {
		return hints.Prefix{}, 0, err
	}
	hs := p.hasher.AppendUint64s(make([]uint64, 0, len(ids)/p.blockSize), ids, kvhash.Extra{CacheSalt: r.CacheSalt})
	pr, err := hints.NewPrefix(hints.Precise, p.blockSize, p.seedID, hs, p.dense)
	promptLen := len(ids)
	if truncated {
		promptLen = max(limit+1, hints.EstimateTokens(len(r.PromptText())))
	}
	return pr, promptLen, err
}
