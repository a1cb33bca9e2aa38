// Package anthropicparser is llm-d's anthropic-parser: the request parser
// for Anthropic's Messages API. It claims messages and
// messages/count_tokens. A messages body is parsed into the same routing
// view as an OpenAI chat request (internal/openai, API "messages"): the
// system prompt becomes a leading system message, so that a conversation
// hashes, renders and is prefix-matched alike through either API. A
// count_tokens request generates nothing and is routed without
// interpretation. Responses' usage (input_tokens, output_tokens) is read
// by the picker's usage scanner.
//
// Parameters: none.
package anthropicparser

import (
	"encoding/json"
	"strings"

	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Type is the registered plugin type.
const Type = "anthropic-parser"

const countTokens = "messages/count_tokens"

// Parser implements anthropic-parser.
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
func (p *Parser) Claims() []string { return []string{string(openai.Messages), countTokens} }

// ParseBody implements parsers.Parser.
func (p *Parser) ParseBody(path string, body []byte) (*openai.Request, error) {
	if strings.HasSuffix(path, countTokens) {
		return nil, nil
	}
	return openai.Parse(openai.Messages, body)
}

var _ parsers.Parser = (*Parser)(nil)
