package engine

import (
	"fmt"
	"math"
	"time"
)

// Model is the shape of a transformer that matters for its step time and KV
// footprint. Weights and KV cache are bf16.
type Model struct {
	Name           string
	Params         float64 // all parameters, embeddings included
	Layers         int
	Hidden         int
	QHeads         int
	KVHeads        int
	HeadDim        int
	Vocab          int
	TiedEmbeddings bool
	MaxModelLen    int
}

const bf16Bytes = 2

// KVBytesPerToken is the K and V of every layer for one token, summed over
// all tensor-parallel ranks.
func (m Model) KVBytesPerToken() int { return 2 * m.Layers * m.KVHeads * m.HeadDim * bf16Bytes }

// WeightBytes is the size of the weights over all ranks.
func (m Model) WeightBytes() float64 { return m.Params * bf16Bytes }

// matmulParams are the parameters every token multiplies through: all but
// the input embedding (a lookup) and the LM head (applied only to the
// positions that sample, counted separately).
func (m Model) matmulParams() float64 {
	emb := float64(m.Vocab) * float64(m.Hidden)
	if m.TiedEmbeddings {
		return m.Params - emb
	}
	return m.Params - 2*emb
}

// GPU is one accelerator's datasheet.
type GPU struct {
	Name string
	// PeakFLOPS is dense bf16 tensor throughput.
	PeakFLOPS float64
	// MemBandwidth is HBM bandwidth in bytes/s.
	MemBandwidth float64
	// MemBytes is the device memory vLLM sees (what nvidia-smi reports).
	MemBytes float64
	// LinkBandwidth is NVLink bandwidth per direction in bytes/s, used by
	// tensor-parallel all-reduces.
	LinkBandwidth float64
}

// Timing turns a batch's shape into a step duration: a roofline,
// max(compute, memory), plus tensor-parallel communication and a fixed
// per-step host overhead.
type Timing struct {
	Model Model
	GPU   GPU
	// TP is the tensor-parallel degree; work and memory split evenly.
	TP int
	// ComputeEfficiency and MemoryEfficiency are the fractions of peak
	// FLOP/s and HBM bandwidth the kernels achieve.
	ComputeEfficiency float64
	MemoryEfficiency  float64
	// StepOverhead is the per-iteration host time (scheduling, input
	// preparation, sampling, detokenisation) not hidden behind the GPU.
	StepOverhead time.Duration
	// SeqOverhead is additional host time per scheduled sequence.
	SeqOverhead time.Duration
	// AllReduceLatency is the fixed cost of one all-reduce; a TP step runs
	// two per layer.
	AllReduceLatency time.Duration
	// ActivationReserve is the memory per GPU held back from the KV cache
	// for activations, CUDA graphs and the CUDA context.
	ActivationReserve float64
}

// Shape is what one engine step computes.
type Shape struct {
	// PrefillTokens are prompt (or recomputed) tokens.
	PrefillTokens int
	// DecodeSeqs are sequences producing their next token from one new
	// token each.
	DecodeSeqs int
	// SampledSeqs are sequences whose step ends in sampling a token (the LM
	// head runs for them only).
	SampledSeqs int
	// ContextTokens is the KV read by attention: for every scheduled
	// sequence, its tokens already in the cache plus the new ones.
	ContextTokens int
	// AttentionPairs counts query-key pairs: for a sequence with c cached
	// and n new tokens, n·c + n(n+1)/2 (causal).
	AttentionPairs float64
}

// Validate reports a Timing that cannot produce durations.
func (t Timing) Validate() error {
	switch {
	case t.TP < 1:
		return fmt.Errorf("%w: timing TP %d < 1", ErrConfig, t.TP)
	case t.Model.Params <= 0 || t.Model.Layers <= 0 || t.Model.KVBytesPerToken() <= 0:
		return fmt.Errorf("%w: model %q lacks params, layers or KV heads", ErrConfig, t.Model.Name)
	case t.GPU.PeakFLOPS <= 0 || t.GPU.MemBandwidth <= 0:
		return fmt.Errorf("%w: GPU %q lacks FLOP/s or bandwidth", ErrConfig, t.GPU.Name)
	case t.ComputeEfficiency <= 0 || t.ComputeEfficiency > 1 || t.MemoryEfficiency <= 0 || t.MemoryEfficiency > 1:
		return fmt.Errorf("%w: efficiencies must lie in (0, 1]", ErrConfig)
	case t.TP > 1 && t.GPU.LinkBandwidth <= 0:
		return fmt.Errorf("%w: TP %d needs the GPU's link bandwidth", ErrConfig, t.TP)
	}
	return nil
}

// StepDuration is the modelled wall time of one engine iteration. An empty
// shape takes no time.
func (t Timing) StepDuration(s Shape) time.Duration {
	tokens := float64(s.PrefillTokens + s.DecodeSeqs)
	if tokens == 0 {
		return 0
	}
	m := t.Model
	tp := float64(t.TP)
	qDim := float64(m.QHeads * m.HeadDim)

	flops := 2*m.matmulParams()*tokens +
		2*float64(m.Vocab)*float64(m.Hidden)*float64(s.SampledSeqs) +
		4*float64(m.Layers)*qDim*s.AttentionPairs
	compute := flops / tp / (t.GPU.PeakFLOPS * t.ComputeEfficiency)

	bytes := m.WeightBytes() + float64(m.KVBytesPerToken())*float64(s.ContextTokens)
	memory := bytes / tp / (t.GPU.MemBandwidth * t.MemoryEfficiency)

	sec := math.Max(compute, memory)
	if t.TP > 1 {
		// Ring all-reduce of the hidden states twice per layer: each rank
		// sends and receives 2(TP-1)/TP of the activations.
		vol := tokens * float64(m.Hidden) * bf16Bytes * 2 * (tp - 1) / tp
		sec += 2 * float64(m.Layers) * (t.AllReduceLatency.Seconds() + vol/t.GPU.LinkBandwidth)
	}
	seqs := s.DecodeSeqs + s.SampledSeqs
	return time.Duration(sec*float64(time.Second)) + t.StepOverhead + time.Duration(seqs)*t.SeqOverhead
}

// NumGPUBlocks is the KV-cache size vLLM would profile: the memory share it
// may use, less weights and the activation reserve, in blocks of blockSize
// tokens, per rank. It is never negative.
func (t Timing) NumGPUBlocks(blockSize int, memoryUtilization float64) int {
	if blockSize <= 0 || t.TP < 1 || t.Model.KVBytesPerToken() <= 0 {
		return 0
	}
	tp := float64(t.TP)
	free := t.GPU.MemBytes*memoryUtilization - t.Model.WeightBytes()/tp - t.ActivationReserve
	perBlock := float64(blockSize) * float64(t.Model.KVBytesPerToken()) / tp
	return max(0, int(free/perBlock))
}
