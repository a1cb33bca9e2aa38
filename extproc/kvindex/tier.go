package kvindex

import "strings"

// Tier is the cache tier a block is held in.
type Tier uint8

const (
	// TierGPU is the server's own KV cache in accelerator memory.
	TierGPU Tier = iota
	// TierCPU is an offload tier: vLLM's CPU offload, or any other tier its
	// offloading connectors name (a storage tier). A hit costs a copy to
	// the device, which is why it weighs less than a GPU hit.
	TierCPU
)

// Weights of a matched block per tier, as the precise prefix scorer counts
// them.
const (
	WeightGPU = 1.0
	WeightCPU = 0.8
)

// TierFromMedium maps a KV event's medium field to a tier. vLLM's block
// pool names its GPU cache "GPU" (older versions leave the medium out); an
// offloading connector names its tier by its spec's medium ("CPU", or
// another for a storage tier). So anything else is an offload tier: taken
// for the GPU tier, a storage tier's blocks would score as GPU hits and its
// removals take copies from the GPU tier.
func TierFromMedium(medium string) Tier {
	if medium == "" || strings.EqualFold(medium, "GPU") {
		return TierGPU
	}
	return TierCPU
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
