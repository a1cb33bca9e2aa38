package parsers

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Parser is a request-parser plugin.
type Parser interface {
	scheduling.RequestParser
	// Claims are the path suffixes the parser handles ("chat/completions");
	// none makes it the fallback for unclaimed paths.
	Claims() []string
	// ParseBody returns the routing view of body, sent to path (Clean'd,
	// one the parser claims unless it is the fallback): nil for a body
	// routed without interpretation. Errors wrap openai.ErrInvalidRequest.
	ParseBody(path string, body []byte) (*openai.Request, error)
}

// ErrUnclaimed wraps the refusal of a path no configured parser claims.
var ErrUnclaimed = fmt.Errorf("%w: no request parser claims the path", openai.ErrInvalidRequest)

// Set is the configured parsers. It is immutable and safe for concurrent
// use.
type Set struct {
	claims   []claim
	fallback Parser
	parsers  []Parser
}

type claim struct {
	suffix string
	p      Parser
}

// NewSet builds the set from parsers in configuration order.
func NewSet(ps []Parser) (*Set, error) {
	s := &Set{}
	types := map[string]bool{}
	for i, p := range ps {
		typ := p.TypedName().Type
		if types[typ] {
			return nil, fmt.Errorf("parser %s: a second parser of type %s", p.TypedName(), typ)
		}
		types[typ] = true
		if s.fallback != nil {
			return nil, fmt.Errorf("parser %s (position %d) comes after %s, which claims every path: the fallback parser must be last", p.TypedName(), i, s.fallback.TypedName())
		}
		s.parsers = append(s.parsers, p)
		claims := p.Claims()
		if len(claims) == 0 {
			s.fallback = p
			continue
		}
		for _, c := range claims {
			c = strings.Trim(strings.TrimSpace(c), "/")
			if c == "" {
				return nil, fmt.Errorf("parser %s claims an empty path", p.TypedName())
			}
			s.claims = append(s.claims, claim{suffix: c, p: p})
		}
	}
	if len(s.parsers) == 0 {
		return nil, errors.New("no request parser")
	}
	return s, nil
}

// Parsers are the parsers in configuration order.
func (s *Set) Parsers() []Parser { return s.parsers }

// Clean is path as parsers match it: without its query and trailing "/".
func Clean(path string) string {
	path, _, _ = strings.Cut(path, "?")
	return strings.TrimSuffix(strings.TrimSpace(path), "/")
}

// Resolve returns the parser for path.
func (s *Set) Resolve(path string) (Parser, error) {
	path = Clean(path)
	var best *claim
	for i, c := range s.claims {
		if strings.HasSuffix(path, c.suffix) && (best == nil || len(c.suffix) > len(best.suffix)) {
			best = &s.claims[i]
		}
	}
	switch {
	case best != nil:
		return best.p, nil
	case s.fallback != nil:
		return s.fallback, nil
	}
	return nil, fmt.Errorf("%w %q", ErrUnclaimed, path)
}

// Parse implements server.BodyParser.
func (s *Set) Parse(path string, body []byte) (*openai.Request, error) {
	p, err := s.Resolve(path)
	if err != nil {
		return nil, err
	}
	r, err := p.ParseBody(Clean(path), body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.TypedName().Type, err)
	}
	return r, nil
}

// Plugin is what every parser plugin embeds: its identity and the
// RequestParser marker.
type Plugin struct{ scheduling.Named }

// RequestParser implements scheduling.RequestParser.
func (Plugin) RequestParser() {}

// NewPlugin is the identity of a parser of type typ configured as name,
// which takes no parameters (it fails when params has some).
func NewPlugin(typ, name string, params json.RawMessage) (Plugin, error) {
	n, err := scheduling.NoParams(typ, name, params)
	return Plugin{n}, err
}
