package burstprefix

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/prefixhash"
)

// Type is the registered plugin type.
const Type = "burst-prefix-cache-producer"

// llm-d's defaults and bounds.
const (
	unlimited            = -1
	DefaultWindowMs      = 100
	MaxWindowMs          = 10000
	DefaultBlockTokens   = 64
	DefaultMaxBatchSize  = 1000
	defaultMaxBlocks     = 2048
	BalanceRequests      = "requests"
	BalanceTokens        = "tokens"
	defaultMaxPerReplica = unlimited
)

// Params are the plugin's parameters.
type Params struct {
	WindowDurationMs       *int   `json:"windowDurationMs"`
	MaxPerReplica          *int   `json:"maxPerReplica"`
	BlockSizeTokens        *int   `json:"blockSizeTokens"`
	MaxPrefixTokensToMatch int    `json:"maxPrefixTokensToMatch"`
	MinColocateBlocks      int    `json:"minColocateBlocks"`
	MaxBatchSize           *int   `json:"maxBatchSize"`
	BalanceBy              string `json:"balanceBy"`
}

// Producer implements burst-prefix-cache-producer.
//
// Ownership: the open window belongs to mu; a sealed window's entries
// belong to the sealing goroutine until its done channel closes, then are
// read-only.
type Producer struct {
	scheduling.Named
	window                 time.Duration
	perReplica, batchSize  int
	blockTokens, maxBlocks int
	minColocate            int
	byTokens               bool
	key                    scheduling.Key[*prefixmatch.Prediction]
	mu                     sync.Mutex
	open                   *window
}

// window is one batch of requests placed together.
type window struct {
	entries []*entry
	done    chan struct{}
	sealed  bool
}

// entry is one request of a window.
type entry struct {
	hashes     []uint64
	candidates []*endpoints.Endpoint
	assigned   *endpoints.Endpoint // nil: no placement
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	or := func(v *int, def int) int {
		if v == nil {
			return def
		}
		return *v
	}
	windowMs, perReplica := or(p.WindowDurationMs, DefaultWindowMs), or(p.MaxPerReplica, defaultMaxPerReplica)
	blockTokens, batchSize := or(p.BlockSizeTokens, DefaultBlockTokens), or(p.MaxBatchSize, DefaultMaxBatchSize)
	switch {
	case windowMs < 1 || windowMs > MaxWindowMs:
		return nil, fmt.Errorf("parameters.windowDurationMs: want 1-%d, got %d", MaxWindowMs, windowMs)
	case perReplica != unlimited && perReplica < 1:
		return nil, fmt.Errorf("parameters.maxPerReplica: want -1 (unlimited) or at least 1, got %d", perReplica)
	case blockTokens < 1:
		return nil, fmt.Errorf("parameters.blockSizeTokens must be positive, got %d", blockTokens)
	case p.MaxPrefixTokensToMatch < 0 || (p.MaxPrefixTokensToMatch > 0 && p.MaxPrefixTokensToMatch < blockTokens):
		return nil, fmt.Errorf("parameters.maxPrefixTokensToMatch: want 0 or at least blockSizeTokens (%d), got %d", blockTokens, p.MaxPrefixTokensToMatch)
	case p.MinColocateBlocks < 0:
		return nil, fmt.Errorf("parameters.minColocateBlocks must not be negative, got %d", p.MinColocateBlocks)
	case batchSize != unlimited && batchSize < 1:
		return nil, fmt.Errorf("parameters.maxBatchSize: want -1 (unlimited) or at least 1, got %d", batchSize)
	case p.BalanceBy != "" && p.BalanceBy != BalanceRequests && p.BalanceBy != BalanceTokens:
		return nil, fmt.Errorf("parameters.balanceBy: want %q or %q, got %q", BalanceRequests, BalanceTokens, p.BalanceBy)
	}
	pr := &Producer{Named: scheduling.NewNamed(Type, name), window: time.Duration(windowMs) * time.Millisecond,
		perReplica: perReplica, batchSize: batchSize, blockTokens: blockTokens, maxBlocks: defaultMaxBlocks,
		minColocate: p.MinColocateBlocks, byTokens: p.BalanceBy == BalanceTokens}
	if p.MaxPrefixTokensToMatch > 0 {
		pr.maxBlocks = p.MaxPrefixTokensToMatch / blockTokens
	}
	pr.key = scheduling.NewKey[*prefixmatch.Prediction](pr.TypedName().String())
	return pr, nil
}

// Produces implements scheduling.DataDependencies.
func (p *Producer) Produces() []string { return []string{p.key.String()} }

// Consumes implements scheduling.DataDependencies: a token producer runs
// first.
func (p *Producer) Consumes() []string { return []string{prefixmatch.TokensKey.String()} }

// hashes are the request's chained block hashes.
func (p *Producer) hashes(cs *scheduling.CycleState, req *scheduling.Request) []uint64 {
	if req.Body == nil {
		return nil
	}
	hp := prefixhash.Params{BlockChars: p.blockTokens * prefixhash.CharsPerToken, MaxBlocks: p.maxBlocks}
	if tokens, ok := scheduling.Read(cs, prefixmatch.TokensKey); ok {
		return prefixhash.Blocks(hp, prefixhash.Seed(req.Body.Model, req.Body.CacheSalt), prefixhash.TokenText(*tokens))
	}
	_, hashes := prefixhash.Request(hp, req.Body)
	return hashes
}

// Produce implements scheduling.DataProducer: the request joins the open
// window (opening one), waits for it to close and leaves its placement.
func (p *Producer) Produce(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) {
	e := &entry{hashes: p.hashes(cs, req), candidates: eps}
	p.mu.Lock()
	w := p.open
	if w == nil {
		w = &window{done: make(chan struct{})}
		p.open = w
		time.AfterFunc(p.window, func() { p.seal(w) })
	}
	full := p.batchSize != unlimited && len(w.entries) >= p.batchSize
	if !full {
		w.entries = append(w.entries, e)
	}
	p.mu.Unlock()
	if full {
		return // no placement: the other scorers decide
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		return
	}
	pred := &prefixmatch.Prediction{BlockTokens: p.blockTokens, PromptTokens: len(e.hashes) * p.blockTokens}
	pred.Reset(eps)
	for i, c := range eps {
		if c == e.assigned {
			pred.Matched(i, float64(len(e.hashes)))
		}
	}
	scheduling.Write(cs, p.key, pred)
}

// MatchOf implements prefixmatch.Source.
func (p *Producer) MatchOf(cs *scheduling.CycleState) (prefixmatch.Match, bool) {
	pred, ok := scheduling.Read(cs, p.key)
	if !ok {
		return prefixmatch.Match{}, false
	}
	return prefixmatch.Match{Prediction: pred, Blocks: pred.PromptTokens / p.blockTokens}, true
}

// PreRequest implements scheduling.PreRequest: the match's readers (the
// scorers and producers that name this one) are done with its
// per-candidate part by the decision, which hands it back to its pool
// (prefixmatch.Prediction.Done) rather than let a streaming response keep
// it until it ends.
func (p *Producer) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, _ *scheduling.Result) {
	if pred, ok := scheduling.Read(cs, p.key); ok {
		pred.Done()
	}
}

// seal closes w to new requests, places its requests and releases them.
func (p *Producer) seal(w *window) {
	p.mu.Lock()
	if w.sealed {
		p.mu.Unlock()
		return
	}
	w.sealed = true
	if p.open == w {
		p.open = nil
	}
	entries := w.entries
	p.mu.Unlock()
	p.assign(entries)
	close(w.done)
}

// unit is what is placed at once: an identical group, or one request.
type unit struct {
	members []*entry
	blocks  int
}

// assign places a closed window's requests (see the package doc).
func (p *Producer) assign(entries []*entry) {
	var replicas []*endpoints.Endpoint
	byPrefix := map[uint64]*unit{} // the last chained hash names the whole prefix
	var units []*unit
	for _, e := range entries {
		if len(e.hashes) == 0 {
			continue
		}
		if replicas == nil {
			replicas = e.candidates
		}
		last := e.hashes[len(e.hashes)-1]
		u := byPrefix[last]
		if u == nil {
			u = &unit{blocks: len(e.hashes)}
			byPrefix[last] = u
			units = append(units, u)
		}
		u.members = append(u.members, e)
	}
	if len(replicas) == 0 {
		return
	}
	// Lone requests are placed only when they share minColocateBlocks
	// leading blocks with another request of the window.
	sharing := map[uint64]int{}
	if p.minColocate > 0 {
		for _, u := range units {
			if u.blocks >= p.minColocate {
				sharing[u.members[0].hashes[p.minColocate-1]] += len(u.members)
			}
		}
	}
	var groups, lone []*unit
	for _, u := range units {
		switch {
		case len(u.members) > 1:
			groups = append(groups, u)
		case p.minColocate > 0 && u.blocks >= p.minColocate && sharing[u.members[0].hashes[p.minColocate-1]] > 1:
			lone = append(lone, u)
		}
	}
	longestFirst := func(a, b *unit) int { return cmp.Compare(b.blocks, a.blocks) }
	slices.SortStableFunc(groups, longestFirst)
	slices.SortStableFunc(lone, longestFirst)
	total := 0
	for _, u := range append(slices.Clip(groups), lone...) {
		if p.byTokens {
			total += u.blocks
		} else {
			total += len(u.members)
		}
	}
	pl := &placement{p: p, replicas: replicas, fairShare: (total + len(replicas) - 1) / len(replicas),
		load: map[*endpoints.Endpoint]int{}, holders: map[uint64][]*endpoints.Endpoint{}}
	for _, u := range groups {
		pl.place(u)
	}
	for _, u := range lone {
		pl.place(u)
	}
}

// placement is one window's placing state.
type placement struct {
	p         *Producer
	replicas  []*endpoints.Endpoint
	fairShare int
	load      map[*endpoints.Endpoint]int
	// holders are the replicas each placed block went to.
	holders map[uint64][]*endpoints.Endpoint
}

// held is, per replica, how many leading blocks of hashes it already
// holds from units placed before.
func (pl *placement) held(hashes []uint64) map[*endpoints.Endpoint]int {
	out := map[*endpoints.Endpoint]int{}
	for _, h := range hashes {
		hs := pl.holders[h]
		if len(hs) == 0 {
			break
		}
		for _, r := range hs {
			out[r]++
		}
	}
	return out
}

func (pl *placement) place(u *unit) {
	hashes := u.members[0].hashes
	var held map[*endpoints.Endpoint]int
	prefer := pl.p.minColocate > 0
	if prefer || pl.p.byTokens {
		held = pl.held(hashes)
	}
	onReplica := map[*endpoints.Endpoint]int{}
	for i := 0; i < len(u.members); {
		target := pl.pick(onReplica, held, prefer)
		run := len(u.members) - i
		if pl.p.perReplica != unlimited {
			run = min(run, max(1, pl.p.perReplica-onReplica[target]))
		}
		for _, m := range u.members[i : i+run] {
			m.assigned = target
		}
		first := onReplica[target] == 0
		onReplica[target] += run
		switch {
		case !pl.p.byTokens:
			pl.load[target] += run
		case first:
			pl.load[target] += max(0, u.blocks-held[target])
		}
		i += run
		prefer = false // only the unit's first replica follows the shared prefix
	}
	for r := range onReplica {
		for _, h := range hashes {
			if !slices.Contains(pl.holders[h], r) {
				pl.holders[h] = append(pl.holders[h], r)
			}
		}
	}
}

// pick is the next replica for a run of a unit.
func (pl *placement) pick(onReplica, held map[*endpoints.Endpoint]int, prefer bool) *endpoints.Endpoint {
	hasRoom := func(r *endpoints.Endpoint) bool {
		return pl.p.perReplica == unlimited || onReplica[r] < pl.p.perReplica
	}
	if prefer {
		var best *endpoints.Endpoint
		for _, r := range pl.replicas {
			if !hasRoom(r) || pl.load[r] >= pl.fairShare || held[r] < pl.p.minColocate {
				continue
			}
			if best == nil || held[r] > held[best] || (held[r] == held[best] && pl.before(r, best)) {
				best = r
			}
		}
		if best != nil {
			return best
		}
	}
	var best *endpoints.Endpoint
	for _, r := range pl.replicas {
		if hasRoom(r) && (best == nil || pl.before(r, best)) {
			best = r
		}
	}
	if best != nil {
		return best
	}
	for _, r := range pl.replicas { // every replica at the cap: overflow
		if best == nil || pl.before(r, best) {
			best = r
		}
	}
	return best
}

// before orders replicas: less window load, fewer running requests, lower
// address.
func (pl *placement) before(a, b *endpoints.Endpoint) bool {
	if pl.load[a] != pl.load[b] {
		return pl.load[a] < pl.load[b]
	}
	if ra, rb := a.Metrics().RunningRequests, b.Metrics().RunningRequests; ra != rb {
		return ra < rb
	}
	return a.Address() < b.Address()
}

var (
	_ scheduling.DataProducer     = (*Producer)(nil)
	_ scheduling.DataDependencies = (*Producer)(nil)
	_ prefixmatch.Source          = (*Producer)(nil)
	_ scheduling.PreRequest       = (*Producer)(nil)
)
