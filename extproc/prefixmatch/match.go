package prefixmatch

import "github.com/kvgate/kvgate/internal/hints"

// DefaultDenseBlocks is how many leading prefix blocks are matched exactly
// before matching thins out to a sample (see internal/hints); the wasm
// filter's default, so that both paths into the picker sample alike.
const DefaultDenseBlocks = 256

// SampledMatch turns a lookup over a prefix sample into matched blocks: runs
// is how many leading samples a candidate holds, and chaining means it holds
// every block up to the last of them.
func SampledMatch(p *hints.Prefix, runs int) int {
	if runs <= 0 {
		return 0
	}
	return p.Samples[runs-1].Index + 1
}

// SampleHashes appends the sample's hashes in order.
func SampleHashes(dst []uint64, p *hints.Prefix) []uint64 {
	for _, s := range p.Samples {
		dst = append(dst, s.Hash)
	}
	return dst
}
