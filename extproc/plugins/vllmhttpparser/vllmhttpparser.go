// Package vllmhttpparser is llm-d's vllmhttp-parser: the request parser
// for vLLM's native HTTP endpoint inference/v1/generate, which takes a
// pre-tokenized prompt (token_ids, required and non-empty),
// sampling_params (max_tokens bounds the output) and an optional model.
// The token ids are the prompt the prefix plugins hash and match, as for
// an OpenAI completions request given as token ids. It claims only that
// path: configure openai-parser beside it for the OpenAI paths.
//
// Parameters: none.
package vllmhttpparser

import (
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Type is the registered plugin type.
const Type = "vllmhttp-parser"

// Parser implements vllmhttp-parser.
type Parser struct{ parsers.Plugin }

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := parsers.NewPlugin(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Parser{n}, nil
}

// Claims implements parsers.Parser.
func (p *Parser) Claims() []string { return []string{string(openai.Generate)} }

// ParseBody implements parsers.Parser.
func (p *Parser) ParseBody(_ string, body []byte) (*openai.Request, error) {
	return openai.Parse(openai.Generate, body)
}

var _ parsers.Parser = (*Parser)(nil)
