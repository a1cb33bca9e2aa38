// Package p2psource is llm-d's p2p-source-producer: it names, in the
// request header x-kv-cache-source-host-port, a peer holding more of the
// prompt's KV cache than the server that will compute it, so that the
// routing sidecar has that server pull the blocks over the P2P connector
// instead of recomputing them.
//
// Before scheduling (a data producer) it reads the prefix match and takes
// as candidates the endpoints within one block of the most cached prompt
// tokens; one of them is sampled with weight 1/(1 + requests waiting
// there), the coordinate being a hash of the request ID, so that the pulls
// of a prefix many servers hold spread over them rather than all hitting
// one. kvgate counts as waiting the picker's live count of requests routed
// there and not yet at their first token, plus the waiting requests of the
// last scrape it did not route (llm-d reads the scraped queue alone). After
// scheduling (PreRequest) the header is set when that peer holds at least
// minCachedTokenDelta tokens more than the computing server: the prefill
// profile's pick when it ran, else the primary pick. A client's copy of
// the header never passes the picker.
//
// kvgate's prefix index does not tell the CPU tier a pull is served from
// apart from the others (llm-d counts only CPU-tier blocks when it knows
// tiers): a source's every tier counts, weighted as the match weighs them.
//
// Parameters:
//
//	prefixMatchInfoProducerName: string  prefix producer whose match is read
//	                             (default: the request's published match)
//	minCachedTokenDelta: int     tokens the peer must hold beyond the
//	                             computing server (default 1, at least 1)
//	prefillProfileName: string   the P/D prefill profile (default "prefill")
//	pullDecider: string          kvgate's: a plugin that decides whether a
//	                             pull is faster than recomputing the tokens
//	                             (transfer-cost-pd-decider); default none:
//	                             every pull past minCachedTokenDelta is made
package p2psource

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// Type is the registered plugin type.
const Type = "p2p-source-producer"

// Params are the plugin's parameters.
type Params struct {
	PrefixMatchInfoProducerName string `json:"prefixMatchInfoProducerName"`
	MinCachedTokenDelta         int    `json:"minCachedTokenDelta"`
	PrefillProfileName          string `json:"prefillProfileName"`
	PullDecider                 string `json:"pullDecider"`
}

// PullDecider decides whether computing should pull tokens prompt tokens
// it lacks from source rather than compute them.
type PullDecider interface {
	scheduling.Plugin
	PullPays(cs *scheduling.CycleState, source, computing *endpoints.Endpoint, tokens int) bool
}

// Producer implements p2p-source-producer.
type Producer struct {
	scheduling.Named
	p      Params
	source prefixmatch.Source // nil: the published match
	pull   PullDecider        // nil: none
	key    scheduling.Key[*state]
}

// state is one request's source candidate and what every candidate held,
// copied at Produce: the match's per-candidate data is recycled before
// PreRequest ends.
type state struct {
	best       *endpoints.Endpoint
	bestTokens int
	candidates []*endpoints.Endpoint
	held       []int
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{MinCachedTokenDelta: 1, PrefillProfileName: "prefill"}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.MinCachedTokenDelta < 1 {
		return nil, fmt.Errorf("parameters.minCachedTokenDelta must be at least 1, got %d", p.MinCachedTokenDelta)
	}
	if p.PrefillProfileName == "" {
		p.PrefillProfileName = "prefill"
	}
	pr := &Producer{Named: scheduling.NewNamed(Type, name), p: p}
	pr.key = scheduling.NewKey[*state](pr.TypedName().String())
	return pr, nil
}

// Resolve implements scheduling.Resolver.
func (p *Producer) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	if name := p.p.PullDecider; name != "" {
		pull, err := scheduling.LookupAs[PullDecider](lookup, "pullDecider", name, "a pull decider")
		if err != nil {
			return err
		}
		p.pull = pull
	}
	if p.p.PrefixMatchInfoProducerName == "" {
		return nil
	}
	src, err := prefixmatch.ResolveSource(lookup, "prefixMatchInfoProducerName", p.p.PrefixMatchInfoProducerName)
	p.source = src
	return err
}

// Produces implements scheduling.DataDependencies.
func (p *Producer) Produces() []string { return nil }

// Consumes implements scheduling.DataDependencies.
func (p *Producer) Consumes() []string { return []string{prefixmatch.MatchKey.String()} }

func (p *Producer) match(cs *scheduling.CycleState) *prefixmatch.Prediction {
	if p.source != nil {
		m, _ := p.source.MatchOf(cs)
		return m.Prediction
	}
	m, _ := scheduling.Read(cs, prefixmatch.MatchKey)
	return m
}

// Produce implements scheduling.DataProducer.
func (p *Producer) Produce(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) {
	m := p.match(cs)
	if m == nil {
		return
	}
	st := &state{candidates: eps, held: make([]int, len(eps))}
	most := 0
	for i, e := range eps {
		st.held[i] = m.HeldTokensOf(e)
		most = max(most, st.held[i])
	}
	scheduling.Write(cs, p.key, st)
	if most == 0 {
		return
	}
	block := max(1, m.BlockTokens)
	total := 0.0
	weights := make([]float64, len(eps))
	for i, e := range eps {
		if h := st.held[i]; h > 0 && h+block >= most {
			l := e.Load()
			weights[i] = 1 / (1 + float64(l.PrefillRequests+l.ExternalWaiting))
			total += weights[i]
		}
	}
	target := spread(req.ID) * total
	for i, w := range weights {
		if w == 0 {
			continue
		}
		st.best, st.bestTokens = eps[i], st.held[i]
		if target < w {
			break
		}
		target -= w
	}
}

// spread maps a request ID onto [0, 1), the same for every decision on it.
func spread(id string) float64 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return float64(h.Sum32()) / (1 << 32)
}

// PreRequest implements scheduling.PreRequest. It is the state's last
// reader: the state goes with it, rather than stay with a streaming
// response (a held count per candidate) until it ends.
func (p *Producer) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Result) {
	st, ok := scheduling.Read(cs, p.key)
	if !ok {
		return
	}
	defer func() { *st = state{} }()
	if st.best == nil || res == nil {
		return
	}
	computing := res.Primary()
	if r := res.Profiles[p.p.PrefillProfileName]; r != nil && len(r.Targets) > 0 {
		computing = r
	}
	if computing == nil || len(computing.Targets) == 0 {
		return
	}
	c := computing.Targets[0]
	if c == st.best {
		return
	}
	held := 0
	for i, e := range st.candidates {
		if e == c {
			held = st.held[i]
		}
	}
	extra := st.bestTokens - held
	if extra < p.p.MinCachedTokenDelta || (p.pull != nil && !p.pull.PullPays(cs, st.best, c, extra)) {
		return
	}
	res.SetHeader(eppwire.HeaderKVCacheSource, st.best.Address())
}

var (
	_ scheduling.DataProducer     = (*Producer)(nil)
	_ scheduling.DataDependencies = (*Producer)(nil)
	_ scheduling.PreRequest       = (*Producer)(nil)
	_ scheduling.Resolver         = (*Producer)(nil)
)
