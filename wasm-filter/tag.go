package main

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/prefixhash"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// prefixHasher computes the prefix hints of one parsed request in one mode.
// Each mode is one implementation, chosen once per plugin configuration.
type prefixHasher interface {
	// hash returns the prefix and the prompt length in tokens (estimated
	// when the mode does not tokenize).
	hash(r *openai.Request) (hints.Prefix, int, error)
}

// errModeUnavailable is returned for modes this build cannot compute.
var errModeUnavailable = errors.New("prefix mode not available in this build")

// newHasher picks the mode's hasher; tok is the VM's tokenizer, nil when
// the VM configuration has none.
func newHasher(c config, tok *tokenizer.Tokenizer) (prefixHasher, error) {
	switch c.mode {
	case hints.Precise:
		return newPrecise(c, tok)
	case hints.Approximate:
		return approximate{
			params:    prefixhash.Params{BlockChars: c.BlockSize * prefixhash.CharsPerToken, MaxBlocks: c.MaxPrefixBlocks},
			blockSize: c.BlockSize,
			dense:     c.DenseBlocks,
		}, nil
	}
	return nil, fmt.Errorf("mode %v: %w", c.mode, errModeUnavailable)
}

// approximate is GIE's prefix-cache-scorer hashing: text blocks of
// blockSize×4 bytes, chained xxhash64 seeded with model and cache_salt.
type approximate struct {
	params    prefixhash.Params
	blockSize int
	dense     int
}

func (a approximate) hash(r *openai.Request) (hints.Prefix, int, error) {
	seed, hashes := prefixhash.Request(a.params, r)
	p, err := hints.NewPrefix(hints.Approximate, a.blockSize, seed, hashes, a.dense)
	if err != nil {
		return hints.Prefix{}, 0, err
	}
	promptLen := hints.EstimateTokens(len(r.PromptText()))
	if len(r.PromptTokenIDs) > 0 {
		// A token-id prompt's length is exact.
		promptLen = len(r.PromptTokenIDs)
	}
	return p, promptLen, nil
}

// tag parses body as a request to api and returns its hints. Errors mean
// the request passes untagged.
func tag(h prefixHasher, api openai.API, body []byte) (hints.Hints, error) {
	r, err := openai.Parse(api, body)
	if err != nil {
		return hints.Hints{}, err
	}
	p, promptLen, err := h.hash(r)
	if err != nil {
		return hints.Hints{}, fmt.Errorf("prefix hash: %w", err)
	}
	return hints.Hints{
		Model:     r.Model,
		Stream:    r.Stream,
		PromptLen: promptLen,
		MaxTokens: r.MaxTokens,
		Prefix:    &p,
	}, nil
}
