package mmcache

import (
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/endpointnotification"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

// Registered plugin types.
const (
	ProducerType = "mm-embeddings-cache-producer"
	ScorerType   = "mm-embeddings-cache-scorer"
)

// llm-d's sizing: the budget per server, and the size it assumes an item
// takes in the server's encoder cache.
const (
	DefaultCacheSizeMB = 4096
	bytesPerItem       = 2 << 20
)

// ProducerParams are mm-embeddings-cache-producer's parameters.
type ProducerParams struct {
	CacheSizeInMBPerServer int `json:"cacheSizeInMBPerServer"`
}

// Producer implements mm-embeddings-cache-producer.
//
// Parameters (llm-d's):
//
//	cacheSizeInMBPerServer: int  the servers' encoder cache in MiB, an
//	                             item counted as 2 MiB (default 4096: 2048
//	                             items an endpoint; 0 or less: the default)
//
// Ownership: caches and every LRU in it belong to mu.
type Producer struct {
	scheduling.Named
	capacity int
	key      scheduling.Key[*match]
	mu       sync.Mutex
	caches   map[string]*lru // by endpoint address
}

// match is one request's items and what each candidate held of them.
type match struct {
	items      []uint64
	candidates []*endpoints.Endpoint
	held       []int
}

// NewProducer is mm-embeddings-cache-producer's factory.
func NewProducer(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p ProducerParams
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	mb := p.CacheSizeInMBPerServer
	if mb <= 0 {
		mb = DefaultCacheSizeMB
	}
	pr := &Producer{Named: scheduling.NewNamed(ProducerType, name), capacity: max(1, int(int64(mb)<<20/bytesPerItem)), caches: map[string]*lru{}}
	pr.key = scheduling.NewKey[*match](pr.TypedName().String())
	return pr, nil
}

// AcceptsSource implements scheduling.DataExtractor: llm-d wires the
// producer under the endpoint notifications, whose removals it follows
// (EndpointsRemoved).
func (p *Producer) AcceptsSource(src scheduling.DataSource) error {
	if _, ok := src.(*endpointnotification.Source); !ok {
		return fmt.Errorf("%s reads %s, not %s", ProducerType, endpointnotification.Type, src.TypedName().Type)
	}
	return nil
}

// Items are the request's distinct multimodal items, in order.
func Items(body *openai.Request) []uint64 {
	if body == nil || (body.API != openai.ChatCompletions && body.API != openai.Messages) {
		return nil
	}
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(body.RawField("messages"), &msgs) != nil {
		return nil
	}
	var items []uint64
	seen := map[uint64]bool{}
	add := func(s string) {
		if s == "" {
			return
		}
		if h := xxhash.Sum64String(s); !seen[h] {
			seen[h] = true
			items = append(items, h)
		}
	}
	for _, m := range msgs {
		var parts []openai.ContentPart
		if json.Unmarshal(m.Content, &parts) != nil {
			continue // string content: no media
		}
		for _, c := range parts {
			switch {
			case c.Type == "image_url" && c.ImageURL != nil:
				add(c.ImageURL.URL)
			case c.Type == "video_url" && c.VideoURL != nil:
				add(c.VideoURL.URL)
			case c.Type == "audio_url" && c.AudioURL != nil:
				add(c.AudioURL.URL)
			case c.Type == "input_audio" && c.InputAudio != nil:
				add(c.InputAudio.Data + c.InputAudio.Format)
			case c.Type == "image" && c.Source != nil:
				add(c.Source.URL + c.Source.Data)
			}
		}
	}
	return items
}

// Produce implements scheduling.DataProducer.
func (p *Producer) Produce(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) {
	items := Items(req.Body)
	if len(items) == 0 {
		return
	}
	m := &match{items: items, candidates: eps, held: make([]int, len(eps))}
	p.mu.Lock()
	for i, e := range eps {
		if c := p.caches[e.Address()]; c != nil {
			for _, it := range items {
				if c.contains(it) {
					m.held[i]++
				}
			}
		}
	}
	p.mu.Unlock()
	scheduling.Write(cs, p.key, m)
}

// PreRequest implements scheduling.PreRequest: the primary profile's
// targets now hold the request's items. It is the match's last reader:
// the match goes with it, rather than stay with a streaming response (a
// held count per candidate) until it ends.
func (p *Producer) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, res *scheduling.Result) {
	m, ok := scheduling.Read(cs, p.key)
	if !ok {
		return
	}
	defer func() { *m = match{} }()
	primary := res.Primary()
	if primary == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range primary.Targets {
		c := p.caches[e.Address()]
		if c == nil {
			c = newLRU(p.capacity)
			p.caches[e.Address()] = c
		}
		for _, it := range m.items {
			c.add(it)
		}
	}
}

// EndpointsRemoved implements scheduling.EndpointsRemoved.
func (p *Producer) EndpointsRemoved(addresses []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range addresses {
		delete(p.caches, a)
	}
}

// Produces implements scheduling.DataDependencies.
func (p *Producer) Produces() []string { return []string{p.key.String()} }

// Consumes implements scheduling.DataDependencies.
func (p *Producer) Consumes() []string { return nil }

// share is eps' shares of the request's items, by the produced match.
func (p *Producer) share(cs *scheduling.CycleState, eps []*endpoints.Endpoint, scores []float64) {
	m, ok := scheduling.Read(cs, p.key)
	if !ok {
		return
	}
	scheduling.AlignSubset(m.candidates, eps, func(i, k int) {
		scores[i] = float64(m.held[k]) / float64(len(m.items))
	})
}

// ScorerParams are mm-embeddings-cache-scorer's parameters.
type ScorerParams struct {
	ProducerName string `json:"producerName"`
}

// Scorer implements mm-embeddings-cache-scorer.
//
// Parameters (llm-d's):
//
//	producerName: string  the producer to read (default the one named
//	                      mm-embeddings-cache-producer)
type Scorer struct {
	scheduling.Named
	producerName string
	producer     *Producer
}

// NewScorer is mm-embeddings-cache-scorer's factory.
func NewScorer(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p ScorerParams
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.ProducerName == "" {
		p.ProducerName = ProducerType
	}
	return &Scorer{Named: scheduling.NewNamed(ScorerType, name), producerName: p.ProducerName}, nil
}

// Resolve implements scheduling.Resolver.
func (s *Scorer) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	pr, err := scheduling.LookupAs[*Producer](lookup, "producerName", s.producerName, "a "+ProducerType)
	if err != nil {
		return err
	}
	s.producer = pr
	return nil
}

// Score implements scheduling.Scorer: the share of the request's items
// each candidate holds; 0 everywhere for a request without media.
func (s *Scorer) Score(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	s.producer.share(cs, eps, scores)
}

// lru is a bounded set of items, least recently added evicted first.
type lru struct {
	capacity int
	order    *list.List // front: most recent
	at       map[uint64]*list.Element
}

func newLRU(capacity int) *lru {
	return &lru{capacity: capacity, order: list.New(), at: map[uint64]*list.Element{}}
}

func (l *lru) contains(it uint64) bool { _, ok := l.at[it]; return ok }

func (l *lru) add(it uint64) {
	if e, ok := l.at[it]; ok {
		l.order.MoveToFront(e)
		return
	}
	l.at[it] = l.order.PushFront(it)
	if l.order.Len() > l.capacity {
		old := l.order.Back()
		l.order.Remove(old)
		delete(l.at, old.Value.(uint64))
	}
}

var (
	_ scheduling.DataProducer     = (*Producer)(nil)
	_ scheduling.PreRequest       = (*Producer)(nil)
	_ scheduling.EndpointsRemoved = (*Producer)(nil)
	_ scheduling.DataExtractor    = (*Producer)(nil)
	_ scheduling.DataDependencies = (*Producer)(nil)
	_ scheduling.Scorer           = (*Scorer)(nil)
	_ scheduling.Resolver         = (*Scorer)(nil)
)
