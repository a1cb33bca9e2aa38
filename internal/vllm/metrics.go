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
	// MetricTimePerOutputTokenSeconds is MetricInterTokenLatencySeconds's
	// older name (one observation per token gap), still read by
	// dashboards; vLLM serves both while the old one is deprecated.
	MetricTimePerOutputTokenSeconds = "vllm:time_per_output_token_seconds"
	// MetricRequestTimePerOutputTokenSeconds is one observation per
	// request: its decode time over its output tokens after the first.
	MetricRequestTimePerOutputTokenSeconds = "vllm:request_time_per_output_token_seconds"
	MetricE2ERequestLatencySeconds         = "vllm:e2e_request_latency_seconds"

	// Per-request phase times: queued (arrival to first scheduled),
	// prefill (scheduled to first token), decode (first to last token),
	// inference (scheduled to last token).
	MetricRequestQueueTimeSeconds     = "vllm:request_queue_time_seconds"
	MetricRequestPrefillTimeSeconds   = "vllm:request_prefill_time_seconds"
	MetricRequestDecodeTimeSeconds    = "vllm:request_decode_time_seconds"
	MetricRequestInferenceTimeSeconds = "vllm:request_inference_time_seconds"
	// MetricTimePerPrefillTokenSeconds is a request's prefill time over
	// its prompt tokens.
	MetricTimePerPrefillTokenSeconds = "vllm:time_per_prefill_token_request_seconds"

	// Per-request token counts and parameters.
	MetricRequestPromptTokens           = "vllm:request_prompt_tokens"
	MetricRequestGenerationTokens       = "vllm:request_generation_tokens"
	MetricRequestMaxNumGenerationTokens = "vllm:request_max_num_generation_tokens"
	MetricRequestParamsMaxTokens        = "vllm:request_params_max_tokens"
	MetricRequestParamsN                = "vllm:request_params_n"
	// MetricIterationTokensTotal is a histogram (the _total is part of
	// vLLM's name) of the tokens computed per engine step.
	MetricIterationTokensTotal = "vllm:iteration_tokens_total"
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
