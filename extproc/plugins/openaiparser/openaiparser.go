// Package openaiparser is llm-d's openai-parser: the request parser for
// OpenAI-style bodies (chat completions, completions, responses, embeddings
// and the other paths internal/openai knows). kvgate's picker parses these
// bodies itself (extproc/server, internal/openai); naming the parser in
// requestHandler.parsers selects that behaviour, the only one kvgate has.
// The configuration loader refuses the parsers kvgate does not have, the
// gRPC ones among them.
//
// Parameters: none.
package openaiparser

import (
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "openai-parser"

// Parser implements openai-parser.
type Parser struct{ scheduling.Named }

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Parser{n}, nil
}

// RequestParser implements scheduling.RequestParser.
func (p *Parser) RequestParser() {}

var _ scheduling.RequestParser = (*Parser)(nil)
