// Package openaiparser is llm-d's openai-parser: the request parser for
// OpenAI-style bodies. It claims llm-d's paths: chat/completions,
// completions, responses and embeddings (parsed by internal/openai, as the
// wasm filter parses them on the fast path, so that both hash a prompt
// alike), their render variants chat/completions/render and
// completions/render (parsed as chat and completions), and conversations
// and images/generations, which carry no prompt to route on and are routed
// without interpretation.
//
// Parameters: none.
package openaiparser

import (
	"encoding/json"
	"strings"

	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Type is the registered plugin type.
const Type = "openai-parser"

// routes maps each claimed suffix to the API its body is parsed as; ""
// routes the body uninterpreted. Longer suffixes come first: the first
// match is the longest.
var routes = []struct {
	suffix string
	api    openai.API
}{
	{"chat/completions/render", openai.ChatCompletions},
	{"completions/render", openai.Completions},
	{"images/generations", ""},
	{"chat/completions", openai.ChatCompletions},
	{"conversations", ""},
	{"completions", openai.Completions},
	{"embeddings", openai.Embeddings},
	{"responses", openai.Responses},
}

// Parser implements openai-parser.
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
func (p *Parser) Claims() []string {
	out := make([]string, len(routes))
	for i, r := range routes {
		out[i] = r.suffix
	}
	return out
}

// ParseBody implements parsers.Parser.
func (p *Parser) ParseBody(path string, body []byte) (*openai.Request, error) {
	for _, r := range routes {
		if !strings.HasSuffix(path, r.suffix) {
			continue
		}
		if r.api == "" {
			return nil, nil
		}
		return openai.Parse(r.api, body)
	}
	return nil, nil // not a claimed path: the Set does not send it here
}

var _ parsers.Parser = (*Parser)(nil)
