package kvhash

import (
	"encoding/binary"
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
// item or cache salt) whose token ids are below 2^21 (every tokenizer's
// vocabulary is smaller): the common case, and the entry stays small. The
// cache is two-way set associative with a fixed number of entries: a
// block whose set is full replaces the way written less recently, so
// memory is bounded, two hot blocks that share a set do not keep evicting
// each other (as they did when every block had one place), and a cache too
// small for the working set only costs the hashing it would have saved.
//
// Safe for concurrent use; one cache serves every Hasher of a block size.
// Lookups take no lock: each entry is a run of words under a version
// (a sequence lock), odd while a writer fills it, so a reader that sees
// the version change under it counts a miss.
type BlockCache struct {
	blockSize int
	words32   int    // words of packed tokens (three 21-bit ids each)
	mask      uint64 // sets − 1
	stride    int    // words per entry: version, parent, hash, packed tokens, padding
	words     []atomic.Uint64
	// victim is, per set, the way its next new block replaces; guarded by
	// the set's stripe lock, read and written by writers only.
	victim []uint8
	locks  [cacheStripes]sync.Mutex // serialise writers of a stripe
}

const (
	// cacheStripes is the number of writer locks the sets are spread over.
	cacheStripes = 64
	// cacheWays is the entries per set.
	cacheWays = 2
	hashWords = Size / 8
	// tokenBits is the width of a token id in an entry: three per word.
	tokenBits = 21
	// lineWords is a cache line in words: entries are padded to whole
	// lines so that one spans as few of them as its size allows (two for
	// 16-token blocks).
	lineWords = 8
)

// NewBlockCache returns a cache of about slots blocks (rounded up to a power
// of two) of blockSize tokens: 128 bytes each for 16-token blocks (72
// bytes, 8 per 3 tokens, rounded up to 64-byte lines).
func NewBlockCache(blockSize, slots int) (*BlockCache, error) {
	if blockSize <= 0 {
		return nil, ErrBlockSize
	}
	sets := cacheStripes
	for sets*cacheWays < slots {
		sets *= 2
	}
	stride := 1 + 2*hashWords + tokenWords(blockSize)
	stride = (stride + lineWords - 1) / lineWords * lineWords
	return &BlockCache{blockSize: blockSize, words32: tokenWords(blockSize), mask: uint64(sets - 1), stride: stride,
		words: make([]atomic.Uint64, sets*cacheWays*stride), victim: make([]uint8, sets)}, nil
}

// tokenWords is how many words hold a block's packed tokens.
func tokenWords(blockSize int) int { return (blockSize + 2) / 3 }

// pack packs block's tokens into packed (room for c.words32 words); false
// when block is not cacheable: not a whole block, or a token id outside
// [0, 2^21).
func (c *BlockCache) pack(block []int, packed []uint64) bool {
	if len(block) != c.blockSize || len(packed) != c.words32 {
		return false
	}
	var or int
	w := 0
	// Two words a turn: one bounds check for six tokens.
	for ; 3*w+6 <= len(block); w += 2 {
		t, p := block[3*w:3*w+6:3*w+6], packed[w:w+2:w+2]
		or |= t[0] | t[1] | t[2] | t[3] | t[4] | t[5]
		p[0] = uint64(t[0]) | uint64(t[1])<<tokenBits | uint64(t[2])<<(2*tokenBits)
		p[1] = uint64(t[3]) | uint64(t[4])<<tokenBits | uint64(t[5])<<(2*tokenBits)
	}
	if 3*w+3 <= len(block) {
		t := block[3*w : 3*w+3 : 3*w+3]
		or |= t[0] | t[1] | t[2]
		packed[w] = uint64(t[0]) | uint64(t[1])<<tokenBits | uint64(t[2])<<(2*tokenBits)
		w++
	}
	if w < len(packed) { // one or two tokens left
		t := block[3*w:]
		v := uint64(t[0])
		or |= t[0]
		if len(t) > 1 {
			v |= uint64(t[1]) << tokenBits
			or |= t[1]
		}
		packed[w] = v
	}
	return uint64(or) < 1<<tokenBits // a negative id has its top bits set
}

// A block's set comes from a rolling key over its chain's tokens up to and
// including the block's own (keyNext), started from the seed and the cache
// salt (start). Two chains with the same tokens (another seed or salt
// mixed in the same way, a multimodal item) share sets and are told apart
// by their parents.

// start is the rolling key before a chain's block 0.
func (c *BlockCache) start(none Hash, salt string) uint64 {
	k := binary.BigEndian.Uint64(none[Size-8:])
	for i := 0; i < len(salt); i++ {
		k = (k ^ uint64(salt[i])) * 0x100000001b3
	}
	return k
}

// keyNext is the rolling key after block: its tokens mixed in pairs, the
// pairs' multiplies independent of one another.
func keyNext(k uint64, block []int) uint64 {
	var acc uint64
	i := 0
	// Two pairs a turn: one bounds check for four tokens (the sum is the
	// same in any order).
	for ; i+4 <= len(block); i += 4 {
		b := block[i : i+4 : i+4]
		acc += (uint64(b[0]) | uint64(b[1])<<32 + uint64(i)) * 0x9e3779b97f4a7c15
		acc += (uint64(b[2]) | uint64(b[3])<<32 + uint64(i+2)) * 0x9e3779b97f4a7c15
	}
	if i+2 <= len(block) {
		acc += (uint64(block[i]) | uint64(block[i+1])<<32 + uint64(i)) * 0x9e3779b97f4a7c15
		i += 2
	}
	if i < len(block) {
		acc += (uint64(block[i]) + uint64(i)) * 0x9e3779b97f4a7c15
	}
	k = (k ^ acc) * 0xbf58476d1ce4e5b9
	return k ^ k>>31
}

// set is the set of a block whose rolling key is k.
func (c *BlockCache) set(k uint64) uint64 {
	k ^= k >> 29
	k *= 0x94d049bb133111eb
	k ^= k >> 32
	return k & c.mask
}

// touch reads every cache line of k's set, so that they are on their way
// before the block is looked up.
func (c *BlockCache) touch(k uint64) {
	set := c.words[int(c.set(k))*cacheWays*c.stride:][:cacheWays*c.stride]
	for i := 0; i < len(set); i += lineWords {
		_ = set[i].Load()
	}
}

// entry is way w of set s.
func (c *BlockCache) entry(s uint64, w int) []atomic.Uint64 {
	i := (int(s)*cacheWays + w) * c.stride
	return c.words[i : i+c.stride]
}

// matches reports whether entry e, at version v (even), holds parent and
// packed; the caller checks the version again after reading the hash.
func matches(e []atomic.Uint64, parent *Hash, packed []uint64) bool {
	toks := e[1+2*hashWords:]
	toks = toks[:len(packed)]
	p := e[1 : 1+hashWords : 1+hashWords]
	return p[0].Load() == binary.LittleEndian.Uint64(parent[0:8]) &&
		p[1].Load() == binary.LittleEndian.Uint64(parent[8:16]) &&
		p[2].Load() == binary.LittleEndian.Uint64(parent[16:24]) &&
		p[3].Load() == binary.LittleEndian.Uint64(parent[24:32]) &&
		sameWords(toks, packed)
}

// sameWords reports whether the entry's token words are packed.
func sameWords(toks []atomic.Uint64, packed []uint64) bool {
	toks = toks[:len(packed)]
	for k, p := range packed {
		if toks[k].Load() != p {
			return false
		}
	}
	return true
}

// get returns the cached hash of the block with this parent and packed
// tokens in set s.
func (c *BlockCache) get(s uint64, parent *Hash, packed []uint64) (Hash, bool) {
	for w := range cacheWays {
		e := c.entry(s, w)
		v := e[0].Load()
		if v == 0 || v&1 == 1 || !matches(e, parent, packed) { // empty, being written, or another block
			continue
		}
		var h Hash
		for k := range hashWords {
			binary.LittleEndian.PutUint64(h[8*k:], e[1+hashWords+k].Load())
		}
		if e[0].Load() != v {
			return Hash{}, false
		}
		return h, true
	}
	return Hash{}, false
}

// put records the hash of the block with this parent and packed tokens in
// set s: in an empty way, else in place of the way written less recently.
func (c *BlockCache) put(s uint64, parent *Hash, packed []uint64, h Hash) {
	mu := &c.locks[s%cacheStripes]
	mu.Lock()
	defer mu.Unlock()
	w := -1
	for k := range cacheWays {
		e := c.entry(s, k)
		v := e[0].Load()
		if v != 0 && matches(e, parent, packed) {
			return // another writer was first
		}
		if v == 0 && w < 0 {
			w = k
		}
	}
	if w < 0 {
		w = int(c.victim[s])
		c.victim[s] = uint8((w + 1) % cacheWays)
	}
	e := c.entry(s, w)
	v := e[0].Load()
	e[0].Store(v + 1)
	for k := range hashWords {
		e[1+k].Store(binary.LittleEndian.Uint64(parent[8*k:]))
		e[1+hashWords+k].Store(binary.LittleEndian.Uint64(h[8*k:]))
	}
	toks := e[1+2*hashWords:]
	for k, p := range packed {
		toks[k].Store(p)
	}
	e[0].Store(v + 2)
}
