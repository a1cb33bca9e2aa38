package prefixmatch

import (
	"sync"

	"github.com/kvgate/kvgate/internal/hints"
)

// Hashing is a matcher's buffers for hashing one request's prompt: its
// block hashes, their sample and the sample's hashes. The matcher needs
// them until its PreRequest has read the sample, while the request's cycle
// state lives until the response ends: released at the decision, they
// serve the next request's hashing instead of staying with a streaming
// response (8 bytes a block, up to the matcher's block bound, and 24 a
// sample with its hash).
type Hashing struct {
	// Blocks are the prompt's block hashes, in order.
	Blocks []uint64
	// Hashes are the sample's hashes, in order (SampleHashes), which the
	// matcher looks up.
	Hashes []uint64
	sample hints.Prefix
}

var hashings = sync.Pool{New: func() any { return new(Hashing) }}

// AcquireHashing returns empty buffers, reusing released ones.
func AcquireHashing() *Hashing { return hashings.Get().(*Hashing) }

// Release hands h to a later request; neither h nor a sample made from it
// may be used afterwards.
func (h *Hashing) Release() {
	h.Blocks, h.Hashes = h.Blocks[:0], h.Hashes[:0]
	h.sample = hints.Prefix{Samples: h.sample.Samples[:0]}
	hashings.Put(h)
}

// Sample is the block sample of h.Blocks (hints.NewPrefix), in h's
// buffers; nil when there are no blocks or the parameters are out of
// range.
func (h *Hashing) Sample(mode hints.Mode, blockSize int, seed uint64, maxDense int) *hints.Prefix {
	p, err := hints.NewPrefixInto(h.sample.Samples, mode, blockSize, seed, h.Blocks, maxDense)
	if err != nil || p.Blocks == 0 {
		return nil
	}
	h.sample = p
	return &h.sample
}
