// Package preciseproducer is llm-d's precise-prefix-cache-producer: the
// precise prefix match of extproc/plugins/precise (the servers' own KV-cache
// contents, from their KV events) as a data producer only. It runs before
// the profiles and publishes each candidate's cached blocks for
// prefix-cache-scorer{prefixMatchInfoProducerName}, no-hit-lru-scorer, the
// live load model and the latency predictor; with speculativeIndexing it
// records the chosen endpoint as computing the prompt. llm-d wires it under
// dataLayer to endpoint-notification-source, which kvgate accepts.
//
// Its parameters are those of precise-prefix-cache-scorer
// (extproc/plugins/precise), in kvgate's flat form or llm-d's layout.
//
// Parameters:
//
//	tokenizer: string       tokenizer.json or its folder
//	blockSize: int          the servers' --block-size (default 16)
//	hashSeed: string        the servers' PYTHONHASHSEED (default "42")
//	hashAlgo: string        sha256_cbor only
//	maxBlocksToMatch: int   leading blocks looked up (default 8192)
//	prefixCacheBytes: int   memory for cached tokenizations (default 64 MiB)
//	denseBlocks: int        leading blocks matched exactly (default 256)
//	speculativeIndexing: bool  count routed prompts as held until they end
//	maxSpeculativeEntries: int  bound on those entries (default 1048576)
//	tokenProcessorConfig: object  llm-d's block size and hash seed
//	indexerConfig: object   llm-d's index configuration
//	kvEventsConfig: object  llm-d's KV-event sources
//	speculativeTTL: duration  refused
package preciseproducer

import (
	"encoding/json"
	"time"

	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "precise-prefix-cache-producer"

// Producer implements precise-prefix-cache-producer.
type Producer struct {
	prefixmatch.MatchProducer
	m *precise.Scorer
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p, err := precise.DecodeParams(raw)
	if err != nil {
		return nil, err
	}
	m, err := precise.NewWithParams(Type, name, p, h)
	if err != nil {
		return nil, err
	}
	return &Producer{MatchProducer: prefixmatch.MatchProducer{Matcher: m}, m: m}, nil
}

// AcceptsSource implements scheduling.DataExtractor.
func (p *Producer) AcceptsSource(src scheduling.DataSource) error { return p.m.AcceptsSource(src) }

// KVEventSources is where the picker gets the KV events the match uses.
func (p *Producer) KVEventSources() precise.KVEvents { return p.m.KVEventSources() }

// KVIndexLogInterval is how often the picker logs the KV index's metrics
// (llm-d's metricsLoggingInterval); 0 for never.
func (p *Producer) KVIndexLogInterval() time.Duration { return p.m.KVIndexLogInterval() }

var (
	_ scheduling.DataProducer     = (*Producer)(nil)
	_ scheduling.DataDependencies = (*Producer)(nil)
	_ scheduling.PreRequest       = (*Producer)(nil)
	_ scheduling.ResponseComplete = (*Producer)(nil)
	_ scheduling.EndpointsRemoved = (*Producer)(nil)
	_ scheduling.DataExtractor    = (*Producer)(nil)
	_ prefixmatch.Source          = (*Producer)(nil)
)
