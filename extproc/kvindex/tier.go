package kvindex

import "strings"

// Tier is the cache tier a block is held in.
type Tier uint8

const (
	// TierGPU is the server's own KV cache in accelerator memory.
	TierGPU Tier = iota
	// TierCPU is vLLM's CPU offload tier: a hit costs a host-to-device copy,
	// which is why it weighs less than a GPU hit.
	TierCPU
)

// Weights of a matched block per tier, as the precise prefix scorer counts
// them.
const (
	WeightGPU = 1.0
	WeightCPU = 0.8
)

// TierFromMedium maps a KV event's medium field to a tier. vLLM leaves the
// medium out (or sends an unknown name) for its GPU cache, so anything but
// "CPU" is the GPU tier.
func TierFromMedium(medium string) Tier {
	if strings.EqualFold(medium, "CPU") {
		return TierCPU
	}
	return TierGPU
}

// Weight is the score one matched block in this tier contributes.
func (t Tier) Weight() float64 {
	if t == TierCPU {
		return WeightCPU
	}
	return WeightGPU
}

func (t Tier) String() string {
	if t == TierCPU {
		return "CPU"
	}
	return "GPU"
}

// bit is the tier's flag in an entry's tier mask.
func (t Tier) bit() uint16 {
	if t == TierCPU {
		return tierCPUBit
	}
	return tierGPUBit
}
