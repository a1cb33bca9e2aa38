// Package approxprefix is llm-d's approx-prefix-cache-producer: the
// approximate prefix match of extproc/plugins/prefix (what the picker
// routed where, hashed in blocks of the prompt) as a data producer only.
// It runs before the profiles, publishes each candidate's matched blocks
// for prefix-cache-scorer{prefixMatchInfoProducerName}, no-hit-lru-scorer,
// the live load model and the latency predictor, and records the chosen
// endpoint after the decision. Several named instances (a GPU and a CPU
// tier with different block sizes) keep separate indexes.
//
// Parameters (llm-d's names and defaults):
//
//	autoTune: bool                take the block size and the capacity from
//	                              the servers' vllm:cache_config_info when
//	                              reported (default true)
//	blockSizeTokens: int          tokens per block (default 16); blocks are
//	                              never smaller than 64 tokens, as in llm-d
//	maxPrefixBlocksToMatch: int   leading blocks matched when
//	                              maxPrefixTokensToMatch is 0 (default 2048)
//	maxPrefixTokensToMatch: int   leading tokens matched (default 131072);
//	                              both bounds 0 match up to 1048576 tokens
//	lruCapacityPerServer: int     blocks remembered per server (default 31250)
//	blockSize: int                deprecated: block size in characters
package approxprefix

import (
	"encoding/json"
	"fmt"

	"github.com/kvgate/kvgate/extproc/plugins/prefix"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/prefixhash"
)

// Type is the registered plugin type.
const Type = "approx-prefix-cache-producer"

// llm-d's defaults.
const (
	DefaultBlockSizeTokens  = 16
	MinBlockTokens          = 64
	DefaultMaxBlocks        = 2048
	DefaultMaxTokens        = 131072
	wholePromptTokens       = 1 << 20
	defaultCapacityPerServe = prefix.DefaultLRUCapacity
)

// Params are the plugin's parameters.
type Params struct {
	AutoTune               *bool `json:"autoTune"`
	BlockSizeTokens        *int  `json:"blockSizeTokens"`
	MaxPrefixBlocksToMatch *int  `json:"maxPrefixBlocksToMatch"`
	MaxPrefixTokensToMatch *int  `json:"maxPrefixTokensToMatch"`
	LRUCapacityPerServer   *int  `json:"lruCapacityPerServer"`
	BlockSize              *int  `json:"blockSize"`
}

// Producer implements approx-prefix-cache-producer.
type Producer struct{ prefixmatch.MatchProducer }

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	get := func(field string, v *int, def int, zeroOK bool) (int, error) {
		if v == nil {
			return def, nil
		}
		if *v < 0 || (*v == 0 && !zeroOK) {
			return 0, fmt.Errorf("parameters.%s must be positive, got %d", field, *v)
		}
		return *v, nil
	}
	bst, err := get("blockSizeTokens", p.BlockSizeTokens, DefaultBlockSizeTokens, false)
	if err != nil {
		return nil, err
	}
	maxBlocks, err := get("maxPrefixBlocksToMatch", p.MaxPrefixBlocksToMatch, DefaultMaxBlocks, true)
	if err != nil {
		return nil, err
	}
	maxTokens, err := get("maxPrefixTokensToMatch", p.MaxPrefixTokensToMatch, DefaultMaxTokens, true)
	if err != nil {
		return nil, err
	}
	capacity, err := get("lruCapacityPerServer", p.LRUCapacityPerServer, defaultCapacityPerServe, false)
	if err != nil {
		return nil, err
	}
	chars := bst * prefixhash.CharsPerToken
	if p.BlockSize != nil {
		if chars, err = get("blockSize", p.BlockSize, 0, false); err != nil {
			return nil, err
		}
	}
	if maxTokens == 0 && maxBlocks == 0 {
		maxTokens = wholePromptTokens
	}
	mp := prefix.Params{BlockSize: chars, MaxPrefixBlocksToMatch: max(maxBlocks, 1), LRUCapacityPerServer: capacity, AutoTune: p.AutoTune, DenseBlocks: prefixmatch.DefaultDenseBlocks}
	m, err := prefix.NewMatcher(Type, name, mp, h)
	if err != nil {
		return nil, err
	}
	m.SetTokenBounds(maxTokens, MinBlockTokens)
	return &Producer{prefixmatch.MatchProducer{Matcher: m}}, nil
}

var (
	_ scheduling.DataProducer     = (*Producer)(nil)
	_ scheduling.DataDependencies = (*Producer)(nil)
	_ scheduling.PreRequest       = (*Producer)(nil)
	_ scheduling.ResponseComplete = (*Producer)(nil)
	_ scheduling.EndpointsRemoved = (*Producer)(nil)
	_ prefixmatch.Source          = (*Producer)(nil)
)
