package vllm

// Metric names as vLLM serves them on /metrics.
const (
	MetricNumRequestsWaiting = "vllm:num_requests_waiting"
	MetricNumRequestsRunning = "vllm:num_requests_running"
	MetricKVCacheUsagePerc   = "vllm:kv_cache_usage_perc"
	// MetricGPUCacheUsagePerc is MetricKVCacheUsagePerc's older name, still
	// served by older vLLM; consumers accept either, producers serve the new
	// one.
	MetricGPUCacheUsagePerc = "vllm:gpu_cache_usage_perc"
	// MetricLoRARequestsInfo's labels (LabelMaxLoRA, ...) carry its meaning;
	// its value is the time they were last true.
	MetricLoRARequestsInfo = "vllm:lora_requests_info"
	// MetricCacheConfigInfo's labels are the engine's cache configuration
	// (LabelBlockSize, LabelNumGPUBlocks, ...); its value is always 1.
	MetricCacheConfigInfo = "vllm:cache_config_info"

	MetricPrefixCacheQueriesTotal = "vllm:prefix_cache_queries_total"
	MetricPrefixCacheHitsTotal    = "vllm:prefix_cache_hits_total"
	MetricPromptTokensTotal       = "vllm:prompt_tokens_total"
	MetricGenerationTokensTotal   = "vllm:generation_tokens_total"
	MetricNumPreemptionsTotal     = "vllm:num_preemptions_total"
	MetricRequestSuccessTotal     = "vllm:request_success_total"

	MetricTimeToFirstTokenSeconds  = "vllm:time_to_first_token_seconds"
	MetricInterTokenLatencySeconds = "vllm:inter_token_latency_seconds"
	MetricE2ERequestLatencySeconds = "vllm:e2e_request_latency_seconds"
)

// Label names of MetricLoRARequestsInfo.
const (
	LabelMaxLoRA             = "max_lora"
	LabelRunningLoRAAdapters = "running_lora_adapters"
	LabelWaitingLoRAAdapters = "waiting_lora_adapters"
)

// Label names of MetricCacheConfigInfo that kvgate reads.
const (
	LabelBlockSize    = "block_size"
	LabelNumGPUBlocks = "num_gpu_blocks"
)
