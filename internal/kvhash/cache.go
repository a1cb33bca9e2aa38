package kvhash

import (
	"encoding/binary"
	"math"
	"sync"
	"sync/atomic"
)

// BlockCache remembers block hashes by their inputs, so that a prefix many
// prompts share (a system prompt, a conversation's earlier turns) is hashed
// once rather than on every request: a block's SHA-256 over its CBOR costs
// several times a lookup here. A hit is exact: the entry holds the parent
// hash and the block's tokens it was computed from, and both are compared,
// so a cached hash is the one HashBlock would return.
//
// Only blocks without extra keys are cached (no LoRA adapter, multimodal
// item or cache salt): the common case, and the entry stays small. The
// cache is direct-mapped with a fixed number of slots: a new block
// overwrites whatever shared its slot, so memory is bounded and a cache too
// small for the working set only costs the hashing it would have saved.
//
// Safe for concurrent use; one cache serves every Hasher of a block size.
// Lookups take no lock: each slot is a run of words under a version
// (a sequence lock), odd while a writer fills it, so a reader that sees
// the version change under it counts a miss.
type BlockCache struct {
	blockSize int
	mask      uint64
	stride    int // words per slot: version, parent, hash, packed tokens
	words     []atomic.Uint64
	locks     [cacheStripes]sync.Mutex // serialise writers of a stripe
}

const (
	// cacheStripes is the number of writer locks the slots are spread over.
	cacheStripes = 64
	hashWords    = Size / 8
)

// NewBlockCache returns a cache of about slots blocks (rounded up to a power
// of two) of blockSize tokens: each takes 72 bytes and 4 per token.
func NewBlockCache(blockSize, slots int) (*BlockCache, error) {
	if blockSize <= 0 {
		return nil, ErrBlockSize
	}
	n := cacheStripes
	for n < slots {
		n *= 2
	}
	stride := 1 + 2*hashWords + (blockSize+1)/2
	return &BlockCache{blockSize: blockSize, mask: uint64(n - 1), stride: stride, words: make([]atomic.Uint64, n*stride)}, nil
}

// slot is where a block with this parent and these tokens lives.
func (c *BlockCache) slot(parent Hash, block []int) uint64 {
	// The parent is a cryptographic hash already; the tokens are mixed
	// into its low bits.
	k := parent.Uint64()
	for _, t := range block {
		k = (k ^ uint64(t)) * 0x100000001b3
	}
	k ^= k >> 29
	return k & c.mask
}

// cacheable reports whether block (at index) is hashed without extra keys
// and fits an entry.
func (c *BlockCache) cacheable(block []int, index int, extra Extra) bool {
	if len(block) != c.blockSize || extra.LoRA != "" || (index == 0 && extra.CacheSalt != "") {
		return false
	}
	start, end := index*c.blockSize, (index+1)*c.blockSize
	for _, it := range extra.MM {
		if it.Offset < end && start < it.Offset+it.Length {
			return false
		}
	}
	for _, t := range block {
		if t < 0 || uint64(t) > math.MaxUint32 {
			return false
		}
	}
	return true
}

// tokenWord packs block's tokens 2k and 2k+1 (cacheable: each fits 32 bits).
func tokenWord(block []int, k int) uint64 {
	w := uint64(block[2*k])
	if 2*k+1 < len(block) {
		w |= uint64(block[2*k+1]) << 32
	}
	return w
}

// get returns the cached hash of block under parent.
func (c *BlockCache) get(i uint64, parent Hash, block []int) (Hash, bool) {
	w := c.words[int(i)*c.stride:][:c.stride]
	v := w[0].Load()
	if v == 0 || v&1 == 1 { // empty, or being written
		return Hash{}, false
	}
	for k := range hashWords {
		if w[1+k].Load() != binary.LittleEndian.Uint64(parent[8*k:]) {
			return Hash{}, false
		}
	}
	toks := w[1+2*hashWords:]
	for k := range toks {
		if toks[k].Load() != tokenWord(block, k) {
			return Hash{}, false
		}
	}
	var h Hash
	for k := range hashWords {
		binary.LittleEndian.PutUint64(h[8*k:], w[1+hashWords+k].Load())
	}
	if w[0].Load() != v {
		return Hash{}, false
	}
	return h, true
}

// put records block's hash under parent.
func (c *BlockCache) put(i uint64, parent Hash, block []int, h Hash) {
	mu := &c.locks[i%cacheStripes]
	mu.Lock()
	defer mu.Unlock()
	w := c.words[int(i)*c.stride:][:c.stride]
	v := w[0].Load()
	w[0].Store(v + 1)
	for k := range hashWords {
		w[1+k].Store(binary.LittleEndian.Uint64(parent[8*k:]))
		w[1+hashWords+k].Store(binary.LittleEndian.Uint64(h[8*k:]))
	}
	toks := w[1+2*hashWords:]
	for k := range toks {
		toks[k].Store(tokenWord(block, k))
	}
	w[0].Store(v + 2)
}
