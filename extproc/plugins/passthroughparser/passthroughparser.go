// Package passthroughparser is llm-d's passthrough-parser: it claims no
// path, so it is the fallback for every path the other parsers do not
// claim (alone, for every path), and routes the body without interpreting
// it: the request is scheduled on load and other payload-free signals, and
// payload scorers (prefix caches, token producers) see no prompt. This is
// llm-d's payload-agnostic mode, for model servers whose API kvgate does
// not parse.
//
// Parameters: none.
package passthroughparser

import (
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Type is the registered plugin type.
const Type = "passthrough-parser"

// Parser implements passthrough-parser.
type Parser struct{ parsers.Plugin }

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := parsers.NewPlugin(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Parser{n}, nil
}

// Claims implements parsers.Parser: none, the fallback.
func (p *Parser) Claims() []string { return nil }

// ParseBody implements parsers.Parser: the body is not interpreted.
func (p *Parser) ParseBody(string, []byte) (*openai.Request, error) { return nil, nil }

var _ parsers.Parser = (*Parser)(nil)
