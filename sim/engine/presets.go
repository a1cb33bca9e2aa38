package engine

import (
	"slices"
	"time"
)

// Models whose shapes come from their Hugging Face config.json files.
var (
	Qwen3_0_6B = Model{
		Name: "Qwen/Qwen3-0.6B", Params: 0.596e9, Layers: 28, Hidden: 1024,
		QHeads: 16, KVHeads: 8, HeadDim: 128, Vocab: 151936, TiedEmbeddings: true, MaxModelLen: 40960,
	}
	Llama3_1_8B = Model{
		Name: "meta-llama/Llama-3.1-8B-Instruct", Params: 8.03e9, Layers: 32, Hidden: 4096,
		QHeads: 32, KVHeads: 8, HeadDim: 128, Vocab: 128256, MaxModelLen: 131072,
	}
	Qwen3_32B = Model{
		Name: "Qwen/Qwen3-32B", Params: 32.76e9, Layers: 64, Hidden: 5120,
		QHeads: 64, KVHeads: 8, HeadDim: 128, Vocab: 151936, MaxModelLen: 40960,
	}
)

// GPUs from NVIDIA's SXM datasheets; MemBytes is what nvidia-smi reports.
var (
	H100 = GPU{Name: "H100-SXM-80GB", PeakFLOPS: 989e12, MemBandwidth: 3.35e12,
		MemBytes: 81559 * (1 << 20), LinkBandwidth: 450e9}
	H200 = GPU{Name: "H200-SXM-141GB", PeakFLOPS: 989e12, MemBandwidth: 4.8e12,
		MemBytes: 143771 * (1 << 20), LinkBandwidth: 450e9}
)

// Preset is a named Timing, the unit the simulator's command line and the
// cluster benchmark choose by name.
type Preset struct {
	Name string
	Timing
}

// The efficiency and overhead constants are shared by every preset and were
// fitted once against the published measurements in TIMING.md, not per row.
const (
	computeEfficiency = 0.55
	memoryEfficiency  = 0.85
	stepOverhead      = 2300 * time.Microsecond
	seqOverhead       = 8 * time.Microsecond
	allReduceLatency  = 12 * time.Microsecond
	activationReserve = 4 << 30
)

func preset(name string, m Model, g GPU, tp int) Preset {
	return Preset{Name: name, Timing: Timing{
		Model: m, GPU: g, TP: tp,
		ComputeEfficiency: computeEfficiency, MemoryEfficiency: memoryEfficiency,
		StepOverhead: stepOverhead, SeqOverhead: seqOverhead,
		AllReduceLatency: allReduceLatency, ActivationReserve: activationReserve,
	}}
}

var presets = []Preset{
	preset("qwen3-0.6b-h100", Qwen3_0_6B, H100, 1),
	preset("llama-3.1-8b-h100", Llama3_1_8B, H100, 1),
	preset("llama-3.1-8b-h200", Llama3_1_8B, H200, 1),
	preset("qwen3-32b-tp2-h100", Qwen3_32B, H100, 2),
	preset("qwen3-32b-tp2-h200", Qwen3_32B, H200, 2),
}

// Presets lists the built-in presets.
func Presets() []Preset { return slices.Clone(presets) }

// LookupPreset finds a built-in preset by name.
func LookupPreset(name string) (Preset, bool) {
	for _, p := range presets {
		if p.Name == name {
			return p, true
		}
	}
	return Preset{}, false
}
