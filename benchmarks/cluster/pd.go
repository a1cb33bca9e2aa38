package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/transfercost"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/sim/engine"
)

// P/D disaggregation in the simulation. A decision naming a prefiller
// (x-prefiller-host-port) runs as llm-d's routing sidecar runs it: the
// prompt goes to the prefill replica as a prefill-only request (max_tokens
// 1, its KV blocks held); when that leg's token is out, the decode replica
// gets the request with the prefiller's KV to pull, over the network path
// between the two replicas; the prefill replica frees the blocks once the
// decode replica has its first token (the pull is over by then).

// Path is the network between two replicas, one way.
type Path struct {
	BytesPerSecond float64
	Latency        time.Duration
}

// Network is the simulated network between replicas: every pair has
// Default unless Pairs names it. A pair's key is its replica indexes, the
// lower first; paths are symmetric.
type Network struct {
	Default Path
	Pairs   map[[2]int]Path
}

// Between is the path from replica a to replica b.
func (n *Network) Between(a, b int) Path {
	if a > b {
		a, b = b, a
	}
	if p, ok := n.Pairs[[2]int{a, b}]; ok {
		return p
	}
	return n.Default
}

func (n *Network) validate(replicas int) error {
	if n == nil {
		return nil
	}
	check := func(p Path) error {
		if !(p.BytesPerSecond > 0) || p.Latency < 0 {
			return fmt.Errorf("network path %+v: bandwidth must be positive and latency not negative", p)
		}
		return nil
	}
	if err := check(n.Default); err != nil {
		return err
	}
	for k, p := range n.Pairs {
		if k[0] < 0 || k[1] >= replicas || k[0] >= k[1] {
			return fmt.Errorf("network pair %v: want two replica indexes, lower first", k)
		}
		if err := check(p); err != nil {
			return err
		}
	}
	return nil
}

// networkView is the simulated network as the node agents would measure
// it, for the picker's transfer-cost decider.
type networkView struct{ s *sim }

var _ transfercost.NetworkView = networkView{}

// PathBetween implements transfercost.NetworkView.
func (v networkView) PathBetween(from, to string) (float64, time.Duration, bool) {
	a, b := v.s.byAddr[from], v.s.byAddr[to]
	if a == nil || b == nil || v.s.opts.Network == nil {
		return 0, 0, false
	}
	p := v.s.opts.Network.Between(a.idx, b.idx)
	return p.BytesPerSecond, p.Latency, true
}

// pdLeg is a P/D request's prefill leg.
type pdLeg struct {
	id              string // the request's id; the leg runs as id+legSuffix
	prefill, decode *replica
	prompt          []int
	out             int
	// priority is the engines' (the objective's, negated).
	priority int
}

// legSuffix names a prefill leg on its replica.
const legSuffix = "/prefill"

// pdState is the simulation's P/D bookkeeping, by request id: the legs
// running on prefill replicas, and the requests whose prefill replica
// holds their blocks until the decode replica's first token.
type pdState struct {
	legs map[string]*pdLeg // by leg id
	held map[string]*pdLeg // by request id
}

func roleLabels(role string) map[string]string {
	if role == "" {
		return nil
	}
	return map[string]string{endpoints.RoleLabel: role}
}

// beginPD starts a P/D request's prefill leg on the prefiller the decision
// named; false when the decision named none.
func (s *sim) beginPD(ctx context.Context, i int, req *server.Request, prompt []int, decode *replica, dec *server.Decision, ex server.Exchange) bool {
	addr := dec.Headers[eppwire.HeaderPrefiller]
	if addr == "" {
		return false
	}
	rr := &s.res.Requests[i]
	p := s.byAddr[addr]
	if p == nil {
		ex.ResponseDone(ctx, server.ResponseSummary{Status: 502, ServedEndpoint: decode.addr})
		s.fail(rr, fmt.Errorf("picker named unknown prefiller %q", addr))
		return true
	}
	if s.pd.legs == nil {
		s.pd = pdState{legs: map[string]*pdLeg{}, held: map[string]*pdLeg{}}
	}
	leg := &pdLeg{id: req.ID, prefill: p, decode: decode, prompt: prompt, out: req.Parsed.MaxTokens, priority: -rr.Priority}
	if err := p.eng.Add(engine.Request{ID: req.ID + legSuffix, Prompt: prompt, MaxTokens: 1, PrefillOnly: true, Priority: leg.priority}); err != nil {
		// The sidecar returns the prefiller's error as it is.
		ex.ResponseDone(ctx, server.ResponseSummary{Status: 503, ServedEndpoint: decode.addr})
		s.fail(rr, fmt.Errorf("prefill engine: %w", err))
		return true
	}
	rr.Replica, rr.Preset, rr.Prefill = decode.idx, decode.preset, p.idx
	req.Parsed.PromptTokenIDs = nil
	s.pd.legs[req.ID+legSuffix] = leg
	// Its engine wait runs from here: the prefill leg and the KV pull
	// count in it.
	s.live[req.ID] = &liveReq{idx: i, ex: ex, rep: decode, arrival: s.start.Add(s.reqs[i].Arrival), received: s.clock.Now()}
	return true
}

// prefilled reports whether id is a prefill leg, and if so hands its
// request to the decode replica, with the KV to pull over the path.
func (s *sim) prefilled(ctx context.Context, id string) bool {
	leg := s.pd.legs[id]
	if leg == nil {
		return false
	}
	delete(s.pd.legs, id)
	path := Path{}
	if s.opts.Network != nil {
		path = s.opts.Network.Between(leg.prefill.idx, leg.decode.idx)
	}
	err := leg.decode.eng.Add(engine.Request{ID: leg.id, Prompt: leg.prompt, MaxTokens: leg.out, Priority: leg.priority,
		RemotePrefill: &engine.RemotePrefill{Tokens: len(leg.prompt), Bandwidth: path.BytesPerSecond, Latency: path.Latency}})
	if err != nil {
		_ = leg.prefill.eng.Release(id)
		if lr := s.live[leg.id]; lr != nil {
			delete(s.live, leg.id)
			lr.ex.ResponseDone(ctx, server.ResponseSummary{Status: 503, ServedEndpoint: leg.decode.addr})
			s.fail(&s.res.Requests[lr.idx], fmt.Errorf("decode engine: %w", err))
		}
		return true
	}
	s.pd.held[leg.id] = leg
	return true
}

// pulled frees a P/D request's blocks on its prefill replica once the
// decode replica has produced its first token.
func (s *sim) pulled(id string) {
	if leg := s.pd.held[id]; leg != nil {
		delete(s.pd.held, id)
		_ = leg.prefill.eng.Release(id + legSuffix)
	}
}
