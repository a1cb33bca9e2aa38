package prefix

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// FromProducer is prefix-cache-scorer with prefixMatchInfoProducerName: it
// scores the named producer's match and keeps no state of its own.
type FromProducer struct {
	scheduling.Named
	producerName string
	length       lengthScore
	source       prefixmatch.Source
}

// scorerOnly are the parameters that make sense on a scorer that reads a
// producer; the hashing ones belong on the producer.
var scorerOnly = []string{"prefixMatchInfoProducerName", "matchLengthWeight", "matchLengthScaleTokens"}

func newFromProducer(name string, p Params, raw json.RawMessage) (*FromProducer, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	for f := range fields {
		if !slices.Contains(scorerOnly, f) {
			return nil, fmt.Errorf("parameters.%s: set it on the producer %q; a scorer with prefixMatchInfoProducerName takes only %v", f, p.PrefixMatchInfoProducerName, scorerOnly)
		}
	}
	length, err := newLengthScore(p)
	if err != nil {
		return nil, err
	}
	return &FromProducer{Named: scheduling.NewNamed(Type, name), producerName: p.PrefixMatchInfoProducerName, length: length}, nil
}

// Resolve implements scheduling.Resolver.
func (s *FromProducer) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	src, err := prefixmatch.ResolveSource(lookup, "prefixMatchInfoProducerName", s.producerName)
	if err != nil {
		return err
	}
	s.source = src
	return nil
}

// Score implements scheduling.Scorer: the producer ran before any profile
// (a data producer), so its match is in the cycle state; without it (the
// producer had no prompt to match) every candidate scores 0.
func (s *FromProducer) Score(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	if s.source == nil {
		return
	}
	if m, ok := s.source.MatchOf(cs); ok {
		s.length.score(m, eps, scores)
	}
}

// MatchOf implements prefixmatch.Source: the producer's match, so that a
// plugin naming this scorer (no-hit-lru-scorer's prefixPluginName) reads
// the same data.
func (s *FromProducer) MatchOf(cs *scheduling.CycleState) (prefixmatch.Match, bool) {
	if s.source == nil {
		return prefixmatch.Match{}, false
	}
	return s.source.MatchOf(cs)
}

var (
	_ scheduling.Scorer   = (*FromProducer)(nil)
	_ scheduling.Resolver = (*FromProducer)(nil)
	_ prefixmatch.Source  = (*FromProducer)(nil)
)
