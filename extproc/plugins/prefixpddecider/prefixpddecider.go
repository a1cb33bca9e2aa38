// Package prefixpddecider is llm-d's prefix-based-pd-decider: a request is
// prefilled on a separate prefill server when the part of its prompt the
// chosen decode server does not hold in its prefix cache is at least
// nonCachedTokens long. The prompt's length is the prefix match's (exact
// when the precise producer tokenized it) or the picker's estimate; the
// held tokens are the published prefix match's for the decode server
// (extproc/prefixmatch). Without a prefix match the request stays local,
// as in llm-d.
//
// kvgate's match weighs a block held only in a slower tier below one in
// GPU memory, where llm-d counts every cached block in full; the two agree
// whenever the index knows one tier.
//
// Parameters:
//
//	nonCachedTokens: int  uncached tokens that make a request disaggregate
//	                      (default 0: never; negative is an error)
//	promptTokens: int     prompts shorter than this never disaggregate
//	                      (default 0: no such gate; negative is an error)
package prefixpddecider

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "prefix-based-pd-decider"

// Params are the decider's parameters.
type Params struct {
	NonCachedTokens int `json:"nonCachedTokens"`
	PromptTokens    int `json:"promptTokens"`
}

// Decider implements prefix-based-pd-decider.
type Decider struct {
	scheduling.Named
	p Params
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.NonCachedTokens < 0 {
		return nil, fmt.Errorf("parameters.nonCachedTokens must not be negative, got %d", p.NonCachedTokens)
	}
	if p.PromptTokens < 0 {
		return nil, fmt.Errorf("parameters.promptTokens must not be negative, got %d", p.PromptTokens)
	}
	if p.NonCachedTokens == 0 && h != nil && h.Log != nil {
		h.Log.Info("nonCachedTokens is 0: the decider never disaggregates", "plugin", Type)
	}
	return &Decider{Named: scheduling.NewNamed(Type, name), p: p}, nil
}

// Disaggregate implements disagg.Decider.
func (d *Decider) Disaggregate(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, decode *endpoints.Endpoint) bool {
	if d.p.NonCachedTokens == 0 || decode == nil {
		return false
	}
	m, ok := scheduling.Read(cs, prefixmatch.MatchKey)
	prompt := req.PromptTokens
	if ok {
		prompt = m.Prompt(prompt)
	}
	if prompt < d.p.PromptTokens || prompt < d.p.NonCachedTokens || !ok {
		return false
	}
	return prompt-m.HeldTokensOf(decode) >= d.p.NonCachedTokens
}
