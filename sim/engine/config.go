package engine

import (
	"fmt"
	"time"

	"github.com/kvgate/kvgate/internal/kvhash"
)

// Config sizes an engine. Zero fields take vLLM's defaults where vLLM has
// one; Timing and Clock are required.
type Config struct {
	// Timing models the model on its GPU(s); usually a Preset's.
	Timing Timing
	// Clock stamps arrivals and times P/D transfers and held blocks.
	Clock Clock
	// Events receives KV-cache events; nil drops them.
	Events EventSink

	// BlockSize is tokens per KV block (default kvhash.DefaultBlockSize, as
	// vLLM).
	BlockSize int
	// NumGPUBlocks is the KV-cache size; 0 derives it from Timing at
	// GPUMemoryUtilization, as vLLM's memory profiling would.
	NumGPUBlocks int
	// GPUMemoryUtilization is vLLM's --gpu-memory-utilization (0.9).
	GPUMemoryUtilization float64
	// MaxNumSeqs bounds the running batch (256).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the per-step token budget (8192).
	MaxNumBatchedTokens int
	// MaxModelLen caps prompt plus output tokens; 0 takes the model's,
	// and it is further capped so that one request fits the cache.
	MaxModelLen int
	// MaxLoRAs is how many adapters may be in one batch; 0 disables LoRA.
	MaxLoRAs int
	// MaxWaiting bounds the waiting queue; Add returns ErrQueueFull beyond
	// it (1024).
	MaxWaiting int
	// SchedulingPolicy is vLLM's --scheduling-policy: SchedulingFCFS (the
	// default) or SchedulingPriority, under which the waiting queue is
	// ordered by (Request.Priority, arrival) and KV pressure preempts the
	// running request with the largest (Priority, arrival) rather than the
	// newest.
	SchedulingPolicy SchedulingPolicy
	// HashSeed is vLLM's PYTHONHASHSEED: it seeds the block-hash chain, so
	// routers must use the same value.
	HashSeed string

	// KVTransferBandwidth (bytes/s) and KVTransferLatency time the pull of
	// remotely prefilled KV (default 12 GB/s, 100G RoCE per NIXL's numbers,
	// and 1 ms).
	KVTransferBandwidth float64
	KVTransferLatency   time.Duration
	// HeldBlockTimeout frees a prefill-only request's blocks if the decoder
	// never releases them (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s).
	HeldBlockTimeout time.Duration
}

// SchedulingPolicy names vLLM's scheduling policies.
type SchedulingPolicy string

// The values of vLLM's --scheduling-policy.
const (
	SchedulingFCFS     SchedulingPolicy = "fcfs"
	SchedulingPriority SchedulingPolicy = "priority"
)

// withDefaults fills zero fields and checks the result.
func (c Config) withDefaults() (Config, error) {
	if c.Clock == nil {
		return c, fmt.Errorf("%w: a Clock is required", ErrConfig)
	}
	if err := c.Timing.Validate(); err != nil {
		return c, err
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.BlockSize, kvhash.DefaultBlockSize)
	def(&c.MaxNumSeqs, 256)
	def(&c.MaxNumBatchedTokens, 8192)
	def(&c.MaxWaiting, 1024)
	if c.GPUMemoryUtilization == 0 {
		c.GPUMemoryUtilization = 0.9
	}
	if c.NumGPUBlocks == 0 {
		c.NumGPUBlocks = c.Timing.NumGPUBlocks(c.BlockSize, c.GPUMemoryUtilization)
	}
	if c.SchedulingPolicy == "" {
		c.SchedulingPolicy = SchedulingFCFS
	}
	if c.SchedulingPolicy != SchedulingFCFS && c.SchedulingPolicy != SchedulingPriority {
		return c, fmt.Errorf("%w: scheduling policy %q (want %q or %q)", ErrConfig, c.SchedulingPolicy, SchedulingFCFS, SchedulingPriority)
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = c.Timing.Model.MaxModelLen
	}
	if c.KVTransferBandwidth == 0 {
		c.KVTransferBandwidth = 12e9
	}
	if c.KVTransferLatency == 0 {
		c.KVTransferLatency = time.Millisecond
	}
	if c.HeldBlockTimeout == 0 {
		c.HeldBlockTimeout = 480 * time.Second
	}
	switch {
	case c.BlockSize < 1 || c.MaxNumSeqs < 1 || c.MaxNumBatchedTokens < 1 || c.MaxWaiting < 1:
		return c, fmt.Errorf("%w: sizes must be positive", ErrConfig)
	case c.NumGPUBlocks < 1:
		return c, fmt.Errorf("%w: no memory left for the KV cache", ErrConfig)
	case c.MaxLoRAs < 0 || c.KVTransferBandwidth < 0 || c.HeldBlockTimeout < 0:
		return c, fmt.Errorf("%w: negative limit", ErrConfig)
	}
	if c.MaxModelLen <= 0 || c.MaxModelLen > c.NumGPUBlocks*c.BlockSize {
		c.MaxModelLen = c.NumGPUBlocks * c.BlockSize
	}
	if c.MaxModelLen < 2 {
		return c, fmt.Errorf("%w: max model len %d leaves no room to generate", ErrConfig, c.MaxModelLen)
	}
	return c, nil
}
