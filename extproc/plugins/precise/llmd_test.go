package precise

import (
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// llm-d's parameter layout maps onto the scorer's parameters and the
// picker's KV-event sources.
func TestLLMDLayout(t *testing.T) {
	tests := []struct {
		name, params    string
		blockSize, maxB int
		seed            string
		ev              KVEvents
	}{
		{"kvgate layout: no KV-event sources", `{"blockSize": 32}`, 32, DefaultMaxBlocksToMatch, "42", KVEvents{}},
		{"llm-d router guide", `{"tokenProcessorConfig": {"blockSize": 64}, "speculativeIndexing": true,
			"indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": true}},
			"kvEventsConfig": {"topicFilter": "kv@", "concurrency": 8, "discoverPods": true, "podDiscoveryConfig": {"socketPort": 5556}}}`,
			64, DefaultMaxBlocksToMatch, "42", KVEvents{SocketPort: 5556}},
		{"older nesting", `{"indexerConfig": {"tokenProcessorConfig": {"blockSize": 5, "hashSeed": "7"}, "kvBlockIndexConfig": {"maxPrefixBlocksToMatch": 256}}}`,
			5, 256, "7", KVEvents{SocketPort: DefaultSocketPort}},
		{"central socket, no discovery", `{"tokenProcessorConfig": {"blockSizeTokens": 16}, "kvEventsConfig": {"zmqEndpoint": "tcp://0.0.0.0:5557", "discoverPods": false}}`,
			16, DefaultMaxBlocksToMatch, "42", KVEvents{Bind: "tcp://0.0.0.0:5557"}},
		{"replay port", `{"kvEventsConfig": {"podDiscoveryConfig": {"replaySocketPort": 5558}}}`, 16, DefaultMaxBlocksToMatch, "42", KVEvents{SocketPort: DefaultSocketPort, ReplayPort: 5558}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t, kvindex.New(kvindex.Config{}), tc.params)
			if s.params.BlockSize != tc.blockSize || s.params.MaxBlocksToMatch != tc.maxB || s.params.HashSeed != tc.seed || s.KVEventSources() != tc.ev {
				t.Fatalf("params %+v, KV events %+v", s.params, s.KVEventSources())
			}
		})
	}
}

func TestLLMDLayoutRefusals(t *testing.T) {
	for params, want := range map[string]string{
		`{"tokenProcessorConfig": {"hashAlgorithm": "xxh64"}}`:                                 "hashAlgorithm",
		`{"kvEventsConfig": {"engineType": "sglang"}}`:                                         "engineType",
		`{"kvEventsConfig": {"topicFilter": "other"}}`:                                         "topicFilter",
		`{"kvEventsConfig": {"podDiscoveryConfig": {"podLabelSelector": "app=vllm"}}}`:         "podLabelSelector",
		`{"kvEventsConfig": {"podDiscoveryConfig": {"socketPort": 70000}}}`:                    "out of range",
		`{"indexerConfig": {"kvBlockIndexConfig": {"redisConfig": {"address": "redis://x"}}}}`: "redisConfig",
		`{"indexerConfig": {"kvBlockIndexConfig": {"inMemoryConfig": {"size": 10}}}}`:          "size",
		`{"indexerConfig": {"tokenizersPoolConfig": {}}}`:                                      "tokenizersPoolConfig",
		`{"tokenProcessorConfig": {}, "indexerConfig": {"tokenProcessorConfig": {}}}`:          "give one",
		`{"speculativeTTL": "2s"}`:                                                             "speculativeTTL",
		`{"indexerConfig": {"kvBlockIndexConfig": {"metricsLoggingInterval": -1}}}`:            "must not be negative",
		`{"indexerConfig": {"kvBlockIndexConfig": {"metricsLoggingInterval": "often"}}}`:       "often",
	} {
		p, err := DecodeParams([]byte(params))
		if err == nil {
			_, err = NewWithParams(Type, "", p, nil)
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", params, err, want)
		}
	}
}

// metricsLoggingInterval takes effect with enableMetrics, as in llm-d, in
// nanoseconds or as a duration string.
func TestMetricsLoggingInterval(t *testing.T) {
	for params, want := range map[string]time.Duration{
		`{"indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": true, "metricsLoggingInterval": 60000000000}}}`:  time.Minute,
		`{"indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": true, "metricsLoggingInterval": "5s"}}}`:         5 * time.Second,
		`{"indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": false, "metricsLoggingInterval": 60000000000}}}`: 0,
		`{"indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": true}}}`:                                         0,
	} {
		p, err := DecodeParams([]byte(params))
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewWithParams(Type, "", p, &scheduling.Handle{Services: WithKVIndex(nil, kvindex.New(kvindex.Config{}))})
		if err != nil {
			t.Fatalf("%s: %v", params, err)
		}
		if got := s.KVIndexLogInterval(); got != want {
			t.Errorf("%s: interval %v, want %v", params, got, want)
		}
	}
}
