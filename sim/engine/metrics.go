package engine

import (
	"maps"
	"slices"
)

// Metrics is a snapshot of what vLLM exports on /metrics and what the
// picker scrapes (REFERENCE §3).
type Metrics struct {
	// Waiting counts queued requests, including those waiting for remote
	// KV (vllm:num_requests_waiting).
	Waiting int
	// Running counts requests in the batch (vllm:num_requests_running).
	Running int
	// KVUsage is the fraction of blocks referenced by requests
	// (vllm:kv_cache_usage_perc); cached but free blocks do not count.
	KVUsage float64
	// RunningLoRAs and WaitingLoRAs are the distinct adapters of running
	// and waiting requests, sorted (vllm:lora_requests_info).
	RunningLoRAs []string
	WaitingLoRAs []string
	MaxLoRAs     int
	// BlockSize and NumGPUBlocks are vllm:cache_config_info.
	BlockSize    int
	NumGPUBlocks int
	// HeldRequests are prefill-only requests still holding blocks.
	HeldRequests int

	// Counters since start, in tokens where vLLM counts tokens.
	PrefixCacheQueries int64
	PrefixCacheHits    int64
	PromptTokens       int64
	GenerationTokens   int64
	Preemptions        int64
	Steps              int64
}

// Metrics takes a snapshot.
func (e *Engine) Metrics() Metrics {
	return Metrics{
		Waiting:            len(e.waiting),
		Running:            len(e.running),
		KVUsage:            float64(e.pool.used()) / float64(len(e.pool.blocks)),
		RunningLoRAs:       loraNames(e.running),
		WaitingLoRAs:       loraNames(e.waiting),
		MaxLoRAs:           e.cfg.MaxLoRAs,
		BlockSize:          e.cfg.BlockSize,
		NumGPUBlocks:       e.cfg.NumGPUBlocks,
		HeldRequests:       len(e.held),
		PrefixCacheQueries: e.stats.prefixQueries,
		PrefixCacheHits:    e.stats.prefixHits,
		PromptTokens:       e.stats.promptTokens,
		GenerationTokens:   e.stats.generatedTokens,
		Preemptions:        e.stats.preemptions,
		Steps:              e.stats.steps,
	}
}

func loraNames(seqs []*seq) []string {
	set := make(map[string]struct{})
	for _, s := range seqs {
		if s.req.LoRA != "" {
			set[s.req.LoRA] = struct{}{}
		}
	}
	return slices.Sorted(maps.Keys(set))
}
