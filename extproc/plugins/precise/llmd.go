package precise

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/duration"
)

// llm-d's parameter layout of the precise prefix cache (llm-d-kv-cache's
// indexer, token processor and KV-events pool configurations). Only the
// fields kvgate honours are declared: any other is an unknown-field error.
type (
	// TokenProcessorConfig: how prompt tokens become block hashes. kvgate
	// matches the servers' own vLLM block hashes, so blockSize and hashSeed
	// must be the servers' --block-size and PYTHONHASHSEED.
	TokenProcessorConfig struct {
		BlockSize       int    `json:"blockSize"`
		BlockSizeTokens int    `json:"blockSizeTokens"`
		HashSeed        string `json:"hashSeed"`
		HashAlgorithm   string `json:"hashAlgorithm"`
	}
	// IndexerConfig: the KV-block index.
	IndexerConfig struct {
		TokenProcessorConfig *TokenProcessorConfig `json:"tokenProcessorConfig"`
		KVBlockIndexConfig   *KVBlockIndexConfig   `json:"kvBlockIndexConfig"`
		// Refused: per-tier weights (kvgate's tiers have fixed weights)
		// and the deprecated in-process tokenizer pool (use tokenizer or
		// a token-producer).
		KVCacheBackendConfigs json.RawMessage `json:"kvCacheBackendConfigs"`
		TokenizersPoolConfig  json.RawMessage `json:"tokenizersPoolConfig"`
	}
	// KVBlockIndexConfig: kvgate's index is in memory, bounded by its
	// own limits; enableMetrics is accepted because kvgate's index
	// metrics are always exported. metricsLoggingInterval (nanoseconds,
	// as llm-d's time.Duration, or a Go duration string) logs the index's
	// metrics that often when enableMetrics is on; as in llm-d it does
	// nothing when enableMetrics is off.
	KVBlockIndexConfig struct {
		// InMemoryConfig selects the in-memory index, kvgate's only one;
		// its size bounds are refused (the index is the picker's, shared
		// by every precise plugin and sized by the picker).
		InMemoryConfig         json.RawMessage `json:"inMemoryConfig"`
		EnableMetrics          bool            `json:"enableMetrics"`
		MaxPrefixBlocksToMatch int             `json:"maxPrefixBlocksToMatch"`
		MetricsLoggingInterval duration.Nanos  `json:"metricsLoggingInterval"`
		// Refused: other index backends.
		RedisConfig           json.RawMessage `json:"redisConfig"`
		CostAwareMemoryConfig json.RawMessage `json:"costAwareMemoryConfig"`
	}
	// KVEventsConfig: where KV events come from.
	KVEventsConfig struct {
		// ZMQEndpoint is a socket the picker binds for servers that
		// publish to it (--kv-events-addr).
		ZMQEndpoint string `json:"zmqEndpoint"`
		// TopicFilter must be vLLM's "kv@" (or empty).
		TopicFilter string `json:"topicFilter"`
		// Concurrency is llm-d's worker count; kvgate's subscriber keeps
		// one ordered pipeline per endpoint, so any positive value is
		// accepted.
		Concurrency int    `json:"concurrency"`
		EngineType  string `json:"engineType"`
		// DiscoverPods subscribes to every endpoint's own publisher at
		// tcp://<endpoint ip>:<podDiscoveryConfig.socketPort>.
		DiscoverPods       *bool               `json:"discoverPods"`
		PodDiscoveryConfig *PodDiscoveryConfig `json:"podDiscoveryConfig"`
	}
	// PodDiscoveryConfig: the ports of each endpoint's KV-event sockets.
	// The endpoints are the pool's; llm-d's podLabelSelector and
	// podNamespace, which pick other pods, are refused when set.
	PodDiscoveryConfig struct {
		SocketPort       int    `json:"socketPort"`
		ReplaySocketPort int    `json:"replaySocketPort"`
		PodLabelSelector string `json:"podLabelSelector"`
		PodNamespace     string `json:"podNamespace"`
	}
)

// KVEvents says where the picker gets KV events for a precise scorer
// configured in llm-d's layout; the zero value adds nothing to the
// picker's flags and endpoint files.
type KVEvents struct {
	// Bind is a socket to bind for servers that publish to the picker.
	Bind string
	// SocketPort and ReplayPort, when positive, are each endpoint's
	// publisher and replay ports on its own IP.
	SocketPort, ReplayPort int
}

// DefaultSocketPort is llm-d's podDiscoveryConfig.socketPort default.
const DefaultSocketPort = 5557

// usesLLMDLayout reports whether the configuration is written in llm-d's
// layout.
func (p *Params) usesLLMDLayout() bool {
	return p.TokenProcessorConfig != nil || p.IndexerConfig != nil || p.KVEventsConfig != nil
}

// applyLLMD folds llm-d's layout into kvgate's flat parameters and
// returns the KV-event sources it asks for. As in llm-d, discoverPods
// defaults to true on port 5557 once the layout is used.
func (p *Params) applyLLMD() (KVEvents, error) {
	var ev KVEvents
	if !p.usesLLMDLayout() {
		return ev, nil
	}
	tp := p.TokenProcessorConfig
	if ic := p.IndexerConfig; ic != nil {
		if ic.TokenProcessorConfig != nil {
			if tp != nil {
				return ev, errors.New("parameters.tokenProcessorConfig and indexerConfig.tokenProcessorConfig: give one")
			}
			tp = ic.TokenProcessorConfig
		}
		if err := scheduling.RefuseSet("kvgate's index weighs device tiers itself and tokenizes in-process (tokenizer) or through a token-producer",
			map[string]json.RawMessage{"indexerConfig.kvCacheBackendConfigs": ic.KVCacheBackendConfigs, "indexerConfig.tokenizersPoolConfig": ic.TokenizersPoolConfig}); err != nil {
			return ev, err
		}
		if bi := ic.KVBlockIndexConfig; bi != nil {
			if err := scheduling.RefuseSet("kvgate's KV index is the picker's one in-memory index; its metrics are always exported",
				map[string]json.RawMessage{"indexerConfig.kvBlockIndexConfig.redisConfig": bi.RedisConfig, "indexerConfig.kvBlockIndexConfig.costAwareMemoryConfig": bi.CostAwareMemoryConfig}); err != nil {
				return ev, err
			}
			if bi.MetricsLoggingInterval < 0 {
				return ev, fmt.Errorf("parameters.indexerConfig.kvBlockIndexConfig.metricsLoggingInterval must not be negative, got %v", time.Duration(bi.MetricsLoggingInterval))
			}
			if bi.EnableMetrics {
				p.logEvery = time.Duration(bi.MetricsLoggingInterval)
			}
			if im := bytes.TrimSpace(bi.InMemoryConfig); len(im) > 0 && !bytes.Equal(im, []byte("{}")) && !bytes.Equal(im, []byte("null")) {
				return ev, &scheduling.UnsupportedParameterError{Param: "indexerConfig.kvBlockIndexConfig.inMemoryConfig", Reason: "the in-memory index is the picker's, sized by the picker"}
			}
		}
		if bi := ic.KVBlockIndexConfig; bi != nil && bi.MaxPrefixBlocksToMatch != 0 {
			if bi.MaxPrefixBlocksToMatch < 0 {
				return ev, fmt.Errorf("parameters.indexerConfig.kvBlockIndexConfig.maxPrefixBlocksToMatch must be positive, got %d", bi.MaxPrefixBlocksToMatch)
			}
			p.MaxBlocksToMatch = bi.MaxPrefixBlocksToMatch
		}
	}
	if tp != nil {
		switch {
		case tp.BlockSizeTokens < 0 || tp.BlockSize < 0:
			return ev, errors.New("parameters.tokenProcessorConfig: block size must be positive")
		case tp.BlockSizeTokens > 0:
			p.BlockSize = tp.BlockSizeTokens
		case tp.BlockSize > 0:
			p.BlockSize = tp.BlockSize
		}
		if tp.HashSeed != "" {
			p.HashSeed = tp.HashSeed
		}
		if tp.HashAlgorithm != "" {
			return ev, &scheduling.UnsupportedParameterError{Param: "tokenProcessorConfig.hashAlgorithm", Reason: fmt.Sprintf("%q: kvgate matches the servers' own vLLM block hashes (hashAlgo is their --prefix-caching-hash-algo)", tp.HashAlgorithm)}
		}
	}
	kc := p.KVEventsConfig
	if kc == nil {
		kc = &KVEventsConfig{}
	}
	switch strings.ToLower(kc.EngineType) {
	case "", "vllm":
	default:
		return ev, &scheduling.UnsupportedParameterError{Param: "kvEventsConfig.engineType", Reason: fmt.Sprintf("%q: kvgate reads vLLM's KV events only", kc.EngineType)}
	}
	if kc.TopicFilter != "" && kc.TopicFilter != "kv@" {
		return ev, &scheduling.UnsupportedParameterError{Param: "kvEventsConfig.topicFilter", Reason: fmt.Sprintf("%q: kvgate reads vLLM's kv@ topics only", kc.TopicFilter)}
	}
	if kc.Concurrency < 0 {
		return ev, fmt.Errorf("parameters.kvEventsConfig.concurrency must not be negative, got %d", kc.Concurrency)
	}
	ev.Bind = kc.ZMQEndpoint
	if kc.DiscoverPods == nil || *kc.DiscoverPods {
		ev.SocketPort = DefaultSocketPort
		if pd := kc.PodDiscoveryConfig; pd != nil {
			if pd.PodLabelSelector != "" || pd.PodNamespace != "" {
				return ev, &scheduling.UnsupportedParameterError{Param: "kvEventsConfig.podDiscoveryConfig.podLabelSelector/podNamespace", Reason: "kvgate subscribes to the pool's own endpoints"}
			}
			for field, port := range map[string]int{"socketPort": pd.SocketPort, "replaySocketPort": pd.ReplaySocketPort} {
				if port < 0 || port > 65535 {
					return ev, fmt.Errorf("parameters.kvEventsConfig.podDiscoveryConfig.%s %d out of range", field, port)
				}
			}
			if pd.SocketPort > 0 {
				ev.SocketPort = pd.SocketPort
			}
			ev.ReplayPort = pd.ReplaySocketPort
		}
	}
	return ev, nil
}

// KVIndexLogInterval is how often the picker logs the KV index's metrics
// for this plugin (llm-d's metricsLoggingInterval); 0 for never.
func (s *Scorer) KVIndexLogInterval() time.Duration { return s.params.logEvery }

// KVEventSources is where the picker gets the KV events this scorer
// matches against, when configured in llm-d's layout.
func (s *Scorer) KVEventSources() KVEvents { return s.kvEvents }

// MatchOf implements prefixmatch.Source.
func (s *Scorer) MatchOf(cs *scheduling.CycleState) (prefixmatch.Match, bool) {
	p, ok := scheduling.Read(cs, s.key)
	if !ok {
		return prefixmatch.Match{}, false
	}
	if p.prefix == nil {
		return prefixmatch.Match{}, true
	}
	return prefixmatch.Match{Prediction: &p.prediction, Blocks: p.prefix.Blocks}, true
}

// AcceptsSource implements scheduling.DataExtractor: llm-d wires the
// precise index to endpoint-notification-source, the endpoint lifecycle
// that kvgate's picker follows for KV-event subscriptions.
func (s *Scorer) AcceptsSource(src scheduling.DataSource) error {
	if _, ok := src.(interface{ EndpointNotifications() }); !ok {
		return fmt.Errorf("%s reads endpoint notifications; source %s (type %s) does not send them", s.TypedName().Type, src.TypedName().Name, src.TypedName().Type)
	}
	return nil
}

var (
	_ prefixmatch.Source       = (*Scorer)(nil)
	_ scheduling.DataExtractor = (*Scorer)(nil)
)
