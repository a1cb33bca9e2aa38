package vllmserver

import (
	"container/list"
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/sim/engine"
)

// maxEncoderCache bounds the encoder outputs a server keeps, by
// multimodal hash.
const maxEncoderCache = 4096

// ecParams names one encoder output an encode server holds (llm-d's EC
// descriptor fields).
type ecParams struct {
	PeerHost  string `json:"peer_host"`
	PeerPort  int    `json:"peer_port"`
	SizeBytes int    `json:"size_bytes"`
}

// encoderCache remembers which multimodal items' encoder outputs a server
// has, least recently used dropped first.
type encoderCache struct {
	mu     sync.Mutex
	lru    list.List
	byHash map[string]*list.Element
	hits   uint64
	misses uint64
}

// seen reports whether id's output is cached, caching it.
func (c *encoderCache) seen(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byHash == nil {
		c.byHash = map[string]*list.Element{}
	}
	if e, ok := c.byHash[id]; ok {
		c.lru.MoveToBack(e)
		c.hits++
		return true
	}
	c.misses++
	c.byHash[id] = c.lru.PushBack(id)
	if c.lru.Len() > maxEncoderCache {
		old := c.lru.Front()
		c.lru.Remove(old)
		delete(c.byHash, old.Value.(string))
	}
	return false
}

func (c *encoderCache) counts() (hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}

// encodeItems runs the encoder for j's multimodal items whose outputs are
// neither cached here nor delivered by an encode server
// (ec_transfer_params, keyed by multimodal hash). The encoder's work is
// modelled as the engine's prefill of the item's placeholder tokens (an
// encoder pass over as many tokens), sharing the engine with other
// requests; its time counts in j's TTFT. An encode server answers with
// ec_transfer_params naming every item's output.
func (s *Server) encodeItems(ctx context.Context, j *job) *apiError {
	n := s.opts.MMTokensPerItem
	for i, p := range j.parts {
		if _, ok := j.ecIn[p.Identifier]; ok && s.opts.Role != RoleEncode {
			s.encoded.Add(1)
			continue
		}
		if !s.encCache.seen(p.Identifier) {
			if aerr := s.runEncoder(ctx, j.id+"-enc-"+strconv.Itoa(i), p.Identifier, n); aerr != nil {
				return aerr
			}
		}
		if s.opts.Role == RoleEncode {
			if j.ecOut == nil {
				j.ecOut = map[string]ecParams{}
			}
			j.ecOut[p.Identifier] = ecParams{PeerHost: s.host, PeerPort: s.port, SizeBytes: n * s.hidden * 2}
		}
	}
	return nil
}

// runEncoder costs the engine one encoder pass over n tokens.
func (s *Server) runEncoder(ctx context.Context, id, mmHash string, n int) *apiError {
	toks := make([]int, n)
	for i := range toks {
		toks[i] = s.padToken
	}
	st, err := s.runner.Submit(engine.Request{ID: id, Prompt: toks, MaxTokens: 1, CacheSalt: "kvgate-encoder",
		MM: []kvhash.MMItem{{Identifier: mmHash, Offset: 0, Length: n}}})
	if err != nil {
		return s.engineError(err, n, 1)
	}
	for {
		_, fin, err := st.Next(ctx)
		if err != nil {
			s.abort(id)
			if errors.Is(err, context.Canceled) {
				return newAPIError(499, "client went away during encoding")
			}
			return newAPIError(500, "encoder: %v", err)
		}
		if fin != nil {
			return nil
		}
	}
}

// registerEncoderMetrics exports the encoder counters.
func (s *Server) registerEncoderMetrics() error {
	for _, m := range []struct {
		name, help string
		v          func() float64
	}{
		{"kvgate_sim_encoder_cache_hits_total", "multimodal items whose encoder output this server had cached", func() float64 { h, _ := s.encCache.counts(); return float64(h) }},
		{"kvgate_sim_encoder_runs_total", "multimodal items this server ran the encoder for", func() float64 { _, m := s.encCache.counts(); return float64(m) }},
		{"kvgate_sim_encoder_remote_total", "multimodal items whose encoder output an encode server delivered (ec_transfer_params)", func() float64 { return float64(s.encoded.Load()) }},
	} {
		if err := s.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: m.name, Help: m.help}, m.v)); err != nil {
			return err
		}
	}
	return nil
}
