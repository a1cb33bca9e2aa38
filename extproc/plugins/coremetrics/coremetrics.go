// Package coremetrics is llm-d's core-metrics-extractor: it reads a
// metrics-data-source's pages into each endpoint's queue length, running
// requests, KV-cache usage, LoRA adapters and cache geometry. The engine of
// a pod is its llm-d.ai/engine-type label (or GIE's
// inference.networking.k8s.io/engine-type); each engine has a table of
// metric specs, `name` or `name{label=value}`. Built in, as in llm-d:
// vllm, sglang, trtllm-serve, triton-tensorrt-llm and triton; an
// engineConfigs entry with a built-in name replaces it. GIE v1.4 names the
// same extractor, with the same parameters, model-server-protocol-metrics
// (GIEType, an alias).
//
// Parameters (llm-d's names):
//
//	engineLabelKey: string   pod label naming the engine (default
//	                         llm-d.ai/engine-type)
//	defaultEngine: string    engine of pods without the label, and of
//	                         unknown engines (default "vllm")
//	engineConfigs: list      engine metric tables: name, queuedRequestsSpec,
//	                         runningRequestsSpec, kvUsageSpec, loraSpec,
//	                         cacheInfoSpec, cacheBlockSizeLabelName,
//	                         cacheNumBlocksLabelName, cacheBlockSizeSpec,
//	                         cacheNumBlocksSpec; customMetrics (attributes
//	                         for other plugins) is refused: nothing in
//	                         kvgate reads custom attributes yet
package coremetrics

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/extproc/endpoints/scrape"
	"github.com/kvgate/kvgate/extproc/plugins/metricsdatasource"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "core-metrics-extractor"

// GIEType is GIE v1.4's name for the extractor: its engineLabelKey,
// defaultEngine and engineConfigs are llm-d's.
const GIEType = "model-server-protocol-metrics"

// Params are the plugin's parameters.
type Params struct {
	EngineLabelKey string         `json:"engineLabelKey"`
	DefaultEngine  string         `json:"defaultEngine"`
	EngineConfigs  []EngineConfig `json:"engineConfigs"`
}

// EngineConfig is one engine's metric table, in llm-d's names.
type EngineConfig struct {
	Name                    string            `json:"name"`
	QueuedRequestsSpec      string            `json:"queuedRequestsSpec"`
	RunningRequestsSpec     string            `json:"runningRequestsSpec"`
	KVUsageSpec             string            `json:"kvUsageSpec"`
	LoRASpec                string            `json:"loraSpec"`
	CacheInfoSpec           string            `json:"cacheInfoSpec"`
	CacheBlockSizeLabelName string            `json:"cacheBlockSizeLabelName"`
	CacheNumBlocksLabelName string            `json:"cacheNumBlocksLabelName"`
	CacheBlockSizeSpec      string            `json:"cacheBlockSizeSpec"`
	CacheNumBlocksSpec      string            `json:"cacheNumBlocksSpec"`
	CustomMetrics           []json.RawMessage `json:"customMetrics"`
}

// Extractor implements core-metrics-extractor.
type Extractor struct {
	scheduling.Named
	engines scrape.Engines
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	x := &Extractor{Named: scheduling.NewNamed(Type, name), engines: scrape.Engines{
		LabelKey: p.EngineLabelKey, Default: p.DefaultEngine, Schemas: scrape.BuiltinSchemas(),
	}}
	if x.engines.LabelKey == "" {
		x.engines.LabelKey = scrape.EngineLabel
	}
	if x.engines.Default == "" {
		x.engines.Default = "vllm"
	}
	seen := map[string]bool{}
	for i, ec := range p.EngineConfigs {
		where := fmt.Sprintf("parameters.engineConfigs[%d]", i)
		if ec.Name == "" {
			return nil, fmt.Errorf("%s.name is required", where)
		}
		if seen[ec.Name] {
			return nil, fmt.Errorf("%s: engine %q configured twice", where, ec.Name)
		}
		seen[ec.Name] = true
		if len(ec.CustomMetrics) > 0 {
			return nil, &scheduling.UnsupportedParameterError{Param: fmt.Sprintf("engineConfigs[%d].customMetrics", i), Reason: "custom endpoint attributes: no kvgate plugin reads them"}
		}
		s, err := schema(ec)
		if err != nil {
			return nil, fmt.Errorf("%s (engine %q): %w", where, ec.Name, err)
		}
		x.engines.Schemas[ec.Name] = s
	}
	if _, ok := x.engines.Schemas[x.engines.Default]; !ok {
		return nil, fmt.Errorf("parameters.defaultEngine %q is neither built in nor in engineConfigs", x.engines.Default)
	}
	return x, nil
}

func schema(ec EngineConfig) (*scrape.Schema, error) {
	var s scrape.Schema
	for _, f := range []struct {
		field string
		spec  string
		dst   *scrape.Selector
	}{
		{"queuedRequestsSpec", ec.QueuedRequestsSpec, &s.Queue},
		{"runningRequestsSpec", ec.RunningRequestsSpec, &s.Running},
		{"kvUsageSpec", ec.KVUsageSpec, &s.KVUsage},
		{"loraSpec", ec.LoRASpec, &s.LoRA},
		{"cacheInfoSpec", ec.CacheInfoSpec, &s.CacheInfo},
		{"cacheBlockSizeSpec", ec.CacheBlockSizeSpec, &s.CacheBlockSize},
		{"cacheNumBlocksSpec", ec.CacheNumBlocksSpec, &s.CacheNumBlocks},
	} {
		sel, err := scrape.ParseSelector(f.spec)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.field, err)
		}
		*f.dst = sel
	}
	if s.Queue.Name == "" && s.Running.Name == "" && s.KVUsage.Name == "" {
		return nil, errors.New("needs at least one of queuedRequestsSpec, runningRequestsSpec, kvUsageSpec")
	}
	s.CacheBlockSizeLabel, s.CacheNumBlocksLabel = ec.CacheBlockSizeLabelName, ec.CacheNumBlocksLabelName
	if s.CacheInfo.Name != "" && s.CacheBlockSizeLabel == "" && s.CacheNumBlocksLabel == "" {
		// vLLM's cache_config_info labels, llm-d's default.
		s.CacheBlockSizeLabel, s.CacheNumBlocksLabel = "block_size", "num_gpu_blocks"
	}
	return &s, nil
}

// AcceptsSource implements scheduling.DataExtractor: it reads Prometheus
// pages, which only a metrics-data-source fetches.
func (x *Extractor) AcceptsSource(src scheduling.DataSource) error {
	if _, ok := src.(*metricsdatasource.Source); !ok {
		return fmt.Errorf("%s reads Prometheus pages; source %s (type %s) does not fetch them", Type, src.TypedName().Name, src.TypedName().Type)
	}
	return nil
}

// ScrapeEngines is how each endpoint's page is read.
func (x *Extractor) ScrapeEngines() *scrape.Engines { return &x.engines }

var _ scheduling.DataExtractor = (*Extractor)(nil)
