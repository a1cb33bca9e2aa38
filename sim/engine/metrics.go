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
	// IterationTokens are the tokens computed per step
	// (vllm:iteration_tokens_total).
	IterationTokens Histogram
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
		IterationTokens:    e.stats.iterationTokens.snapshot(),
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

// IterationTokensBuckets are the upper bounds of vLLM's
// vllm:iteration_tokens_total histogram (tokens per engine step).
var IterationTokensBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}

// Histogram is a cumulative histogram snapshot in Prometheus's shape.
type Histogram struct {
	Count uint64
	Sum   float64
	// Buckets maps each upper bound to the observations at or below it.
	Buckets map[float64]uint64
}

// histogram counts observations per IterationTokensBuckets bucket; the
// engine's lock guards it.
type histogram struct {
	count  uint64
	sum    float64
	counts [14]uint64 // per bucket, the last one above every bound
}

func (h *histogram) observe(v int) {
	h.count++
	h.sum += float64(v)
	i, _ := slices.BinarySearch(IterationTokensBuckets, float64(v))
	h.counts[i]++
}

func (h *histogram) snapshot() Histogram {
	out := Histogram{Count: h.count, Sum: h.sum, Buckets: make(map[float64]uint64, len(IterationTokensBuckets))}
	var cum uint64
	for i, ub := range IterationTokensBuckets {
		cum += h.counts[i]
		out.Buckets[ub] = cum
	}
	return out
}
