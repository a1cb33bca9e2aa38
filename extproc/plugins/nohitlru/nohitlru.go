// Package nohitlru is llm-d's no-hit-lru-scorer. A cold request (no
// candidate holds any block of its prompt) creates new KV blocks wherever
// it goes; spreading cold requests over the servers least recently given
// one spreads that cache growth. Cold requests score servers never given
// one highest, then from least to most recently given one (1 down to 0 in
// equal steps over the candidates); warm requests score every candidate
// 0.5, leaving the choice to the prefix scorers. Only cold requests move a
// server in the LRU order (the primary target, and a "prefill" profile's).
//
// The match read is, in order: the plugin named by
// prefixMatchInfoProducerName, the one named by prefixPluginName, or the
// request's published prefix match (the exact one when both kinds of
// producer are configured). Without any match every request is cold.
//
// Parameters (llm-d's names):
//
//	prefixMatchInfoProducerName: string  producer whose match tells a hit
//	prefixPluginName: string  llm-d's older way to name it: a prefix scorer
//	prefixPluginType: string  its type, checked when set (llm-d's default
//	                          "prefix-cache-scorer")
//	lruSize: int              servers remembered (default 1024)
package nohitlru

import (
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "no-hit-lru-scorer"

// DefaultLRUSize is llm-d's lruSize default.
const DefaultLRUSize = 1024

// prefillProfile is the profile whose target also counts, as in llm-d.
const prefillProfile = "prefill"

// Params are the plugin's parameters.
type Params struct {
	PrefixMatchInfoProducerName string `json:"prefixMatchInfoProducerName"`
	PrefixPluginName            string `json:"prefixPluginName"`
	PrefixPluginType            string `json:"prefixPluginType"`
	LRUSize                     int    `json:"lruSize"`
}

// Scorer implements no-hit-lru-scorer.
type Scorer struct {
	scheduling.Named
	params Params
	source prefixmatch.Source // nil: the published match
	key    scheduling.Key[*bool]

	// mu guards the LRU: order (front = most recently given a cold
	// request) and its index by address, both bounded by LRUSize.
	mu    sync.Mutex
	order *list.List
	at    map[string]*list.Element
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{LRUSize: DefaultLRUSize}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.LRUSize <= 0 {
		return nil, fmt.Errorf("parameters.lruSize must be positive, got %d", p.LRUSize)
	}
	s := &Scorer{Named: scheduling.NewNamed(Type, name), params: p, order: list.New(), at: map[string]*list.Element{}}
	s.key = scheduling.NewKey[*bool](s.TypedName().String())
	return s, nil
}

// Resolve implements scheduling.Resolver.
func (s *Scorer) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	param, name := "prefixMatchInfoProducerName", s.params.PrefixMatchInfoProducerName
	if name == "" {
		param, name = "prefixPluginName", s.params.PrefixPluginName
	}
	if name == "" {
		return nil
	}
	src, err := prefixmatch.ResolveSource(lookup, param, name)
	if err != nil {
		return err
	}
	if t := s.params.PrefixPluginType; t != "" && param == "prefixPluginName" && src.TypedName().Type != t {
		return fmt.Errorf("parameters.prefixPluginType: %q is a %s, not a %s", name, src.TypedName().Type, t)
	}
	s.source = src
	return nil
}

func (s *Scorer) match(cs *scheduling.CycleState) prefixmatch.Match {
	if s.source != nil {
		m, _ := s.source.MatchOf(cs)
		return m
	}
	if p, ok := scheduling.Read(cs, prefixmatch.MatchKey); ok {
		blocks := p.PromptTokens / max(1, p.BlockTokens)
		return prefixmatch.Match{Prediction: p, Blocks: max(1, blocks)}
	}
	return prefixmatch.Match{}
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	cold := !s.match(cs).Hit(eps)
	scheduling.Write(cs, s.key, &cold)
	if !cold {
		for i := range eps {
			scores[i] = 0.5
		}
		return
	}
	n := len(eps)
	if n == 1 {
		scores[0] = 1
		return
	}
	// Rank: never-used candidates first (in candidate order), then used
	// ones from least to most recently used.
	s.mu.Lock()
	defer s.mu.Unlock()
	rank := 0
	for i, e := range eps {
		if _, used := s.at[e.Address()]; !used {
			scores[i] = 1 - float64(rank)/float64(n-1)
			rank++
		}
	}
	if rank == n {
		return
	}
	// A used candidate ranks after the never-used ones by its place in
	// the whole LRU from the oldest end, as in llm-d: one walk of the
	// bounded list.
	used := make(map[string]int, n-rank)
	for i, e := range eps {
		if _, ok := s.at[e.Address()]; ok {
			used[e.Address()] = i
		}
	}
	age := 0
	for x := s.order.Back(); x != nil && len(used) > 0; x = x.Prev() {
		if i, ok := used[x.Value.(string)]; ok {
			scores[i] = max(0, 1-float64(rank+age)/float64(n-1))
			delete(used, x.Value.(string))
		}
		age++
	}
}

// PreRequest implements scheduling.PreRequest: a cold request's targets
// become the most recently used.
func (s *Scorer) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Result) {
	cold, ok := scheduling.Read(cs, s.key)
	if !ok || !*cold || res == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := res.Primary(); p != nil && len(p.Targets) > 0 {
		s.touch(p.Targets[0].Address())
	}
	if p := res.Profiles[prefillProfile]; p != nil && res.PrimaryProfile != prefillProfile && len(p.Targets) > 0 {
		s.touch(p.Targets[0].Address())
	}
}

func (s *Scorer) touch(addr string) {
	if el, ok := s.at[addr]; ok {
		s.order.MoveToFront(el)
		return
	}
	s.at[addr] = s.order.PushFront(addr)
	if s.order.Len() > s.params.LRUSize {
		old := s.order.Back()
		s.order.Remove(old)
		delete(s.at, old.Value.(string))
	}
}

// EndpointsRemoved implements scheduling.EndpointsRemoved.
func (s *Scorer) EndpointsRemoved(addresses []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range addresses {
		if el, ok := s.at[a]; ok {
			s.order.Remove(el)
			delete(s.at, a)
		}
	}
}

var (
	_ scheduling.Scorer           = (*Scorer)(nil)
	_ scheduling.PreRequest       = (*Scorer)(nil)
	_ scheduling.Resolver         = (*Scorer)(nil)
	_ scheduling.EndpointsRemoved = (*Scorer)(nil)
)
