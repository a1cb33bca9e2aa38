package kvhash

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// DefaultSeed and DefaultBlockSize are what every kvgate component assumes
// when it is not told the model servers' values. They are one contract, not
// two defaults: a picker that hashes prompts finds a server's cached blocks
// only when both hash with the same seed and block size, so a component that
// picked its own default would silently match nothing. DefaultSeed is
// llm-d's PYTHONHASHSEED convention and the seed of the shared test vector;
// DefaultBlockSize is vLLM's default --block-size.
const (
	DefaultSeed      = "42"
	DefaultBlockSize = 16
)

// Size is the length of a block hash in bytes.
const Size = sha256.Size

// Hash is one block's full SHA-256 digest. The full 32 bytes, not the 64-bit
// event value, chain into the next block.
type Hash [Size]byte

// Uint64 is the value vLLM publishes in KV events: the digest's last 8 bytes,
// big-endian.
func (h Hash) Uint64() uint64 { return binary.BigEndian.Uint64(h[Size-8:]) }

// String is the digest in lowercase hex, as Python's bytes.hex() prints it.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// Extra carries the request attributes that vLLM mixes into block hashes so
// that identical token ids under a different adapter or salt never share KV.
type Extra struct {
	// LoRA is the adapter name; it enters every block's hash.
	LoRA string
	// CacheSalt isolates a tenant's prefixes; it enters block 0 only, which
	// is enough because every later block chains on block 0.
	CacheSalt string
	// MM are the prompt's multimodal items (images, audio, video), sorted
	// by Offset: each block that holds some of an item's placeholder tokens
	// carries (identifier, item offset − block start) among its extra
	// keys, so identical placeholders of different media never share KV.
	MM []MMItem
}

// MMItem is one multimodal input's place in a prompt: vLLM's
// mm_feature.identifier (its mm_hash) and mm_position.
type MMItem struct {
	Identifier string
	// Offset is the item's first placeholder token; Length its count.
	Offset, Length int
}

// ErrBlockSize reports a block size that cannot cut a prompt into blocks.
var ErrBlockSize = errors.New("kvhash: block size must be positive")

// NoneHash is the parent of block 0 for a given PYTHONHASHSEED:
// SHA256(CBOR(text(seed))).
func NoneHash(seed string) Hash {
	buf := appendHead(make([]byte, 0, 9+len(seed)), majorText, uint64(len(seed)))
	buf = append(buf, seed...)
	return sha256.Sum256(buf)
}

// Hasher hashes the blocks of token sequences for one seed and block size.
// It holds no per-call state, so one Hasher serves any number of goroutines
// (set its cache with UseCache before sharing it).
type Hasher struct {
	none      Hash
	blockSize int
	cache     *BlockCache // nil: every block is hashed
}

// New returns a Hasher for vLLM's PYTHONHASHSEED value seed and the server's
// block size (vLLM's default is DefaultBlockSize).
func New(seed string, blockSize int) (*Hasher, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("%w: got %d", ErrBlockSize, blockSize)
	}
	return &Hasher{none: NoneHash(seed), blockSize: blockSize}, nil
}

// None is the parent hash of block 0.
func (h *Hasher) None() Hash { return h.none }

// BlockSize is the number of tokens per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

// BlockHashes returns the hashes of every full block of tokens.
func (h *Hasher) BlockHashes(tokens []int, extra Extra) []Hash {
	return h.AppendBlockHashes(make([]Hash, 0, len(tokens)/h.blockSize), tokens, extra)
}

// AppendBlockHashes continues a request's hash chain. done holds the hashes
// of the request's first len(done) blocks (possibly none) and tokens is the
// request's whole token sequence so far; the hashes of the full blocks after
// them are appended to done. This lets a caller hash a growing sequence (a
// decoding request) in time proportional to the new blocks only.
func (h *Hasher) AppendBlockHashes(done []Hash, tokens []int, extra Extra) []Hash {
	parent := h.none
	if n := len(done); n > 0 {
		parent = done[n-1]
	}
	h.chain(parent, tokens, len(done), extra, func(v Hash) { done = append(done, v) })
	return done
}

// AppendUint64s appends the event values of every full block of tokens to dst
// and returns it. It is the allocation-free path for callers that only need
// to compare with published events, such as the wasm filter.
func (h *Hasher) AppendUint64s(dst []uint64, tokens []int, extra Extra) []uint64 {
	h.chain(h.none, tokens, 0, extra, func(v Hash) { dst = append(dst, v.Uint64()) })
	return dst
}

// chain hashes the full blocks of tokens from block from on, given the
// hash of the block before (none for block 0), passing each to emit.
func (h *Hasher) chain(parent Hash, tokens []int, from int, extra Extra, emit func(Hash)) {
	bs := h.blockSize
	n := len(tokens) / bs
	c := h.cache
	if c == nil || extra.LoRA != "" || c.words32 > maxPackedWords {
		for i := from; i < n; i++ {
			parent = h.HashBlock(parent, tokens[i*bs:(i+1)*bs], i, extra)
			emit(parent)
		}
		return
	}
	// Each block's set comes from a rolling key over the tokens so far,
	// not from its parent's hash, so the sets of the blocks ahead are
	// known before their parents are. They are touched a group at a time,
	// a group ahead: a burst of reads is in flight at once, where reads
	// spread over the loop would wait for one another (each holds up
	// the processor's reorder window until it completes).
	var keys [2 * keyGroup]uint64
	k := c.start(h.none, extra.CacheSalt)
	for i := range from { // a continued chain: its key so far
		k = keyNext(k, tokens[i*bs:(i+1)*bs])
	}
	ahead := from // the first block not yet touched
	touch := func() {
		for end := min(ahead+keyGroup, n); ahead < end; ahead++ {
			k = keyNext(k, tokens[ahead*bs:(ahead+1)*bs])
			keys[ahead%len(keys)] = k
			c.touch(k)
		}
	}
	touch()
	var buf [maxPackedWords]uint64
	packed := buf[:c.words32]
	for i := from; i < n; i++ {
		if (i-from)%keyGroup == 0 {
			touch()
		}
		block := tokens[i*bs : (i+1)*bs]
		parent = h.cached(c, parent, block, i, extra, keys[i%len(keys)], packed)
		emit(parent)
	}
}

// keyGroup is how many blocks chain touches the cache for at once.
const keyGroup = 8

// UseCache makes h look blocks up in c before hashing them (see
// BlockCache); c must be for h's block size.
func (h *Hasher) UseCache(c *BlockCache) error {
	if c.blockSize != h.blockSize {
		return fmt.Errorf("kvhash: cache for blocks of %d tokens, hasher's are %d", c.blockSize, h.blockSize)
	}
	h.cache = c
	return nil
}

// cached is HashBlock through cache c, for a block whose rolling key is
// key; packed is room for the block's packed tokens.
func (h *Hasher) cached(c *BlockCache, parent Hash, block []int, index int, extra Extra, key uint64, packed []uint64) Hash {
	if !cacheable(block, index, extra) || !c.pack(block, packed) {
		return h.HashBlock(parent, block, index, extra)
	}
	set := c.set(key)
	if v, ok := c.get(set, &parent, packed); ok {
		return v
	}
	v := h.HashBlock(parent, block, index, extra)
	c.put(set, &parent, packed, v)
	return v
}

// maxPackedWords bounds the blocks a BlockCache holds: 258 tokens, past
// the largest block size vLLM offers.
const maxPackedWords = 86

// cacheable reports whether block (at index) is hashed without extra keys:
// no adapter, no salt (block 0) and no multimodal item overlapping it.
func cacheable(block []int, index int, extra Extra) bool {
	if extra.LoRA != "" || (index == 0 && extra.CacheSalt != "") {
		return false
	}
	if len(extra.MM) == 0 {
		return true
	}
	start, end := index*len(block), (index+1)*len(block)
	for _, it := range extra.MM {
		if it.Offset < end && start < it.Offset+it.Length {
			return false
		}
	}
	return true
}

// HashBlock hashes one block given its parent's hash and its position in the
// request (the cache salt applies to position 0 only). block may be of any
// length; vLLM only hashes full blocks.
func (h *Hasher) HashBlock(parent Hash, block []int, index int, extra Extra) Hash {
	// A block's encoding fits on the stack (16 tokens of up to 9 bytes and
	// the parent hash take under 200 bytes); larger ones grow onto the heap.
	var enc [encodingBuffer]byte
	b := append(enc[:0], majorArray|3)
	b = appendHead(b, majorBytes, Size)
	b = append(b, parent[:]...)
	b = appendHead(b, majorArray, uint64(len(block)))
	for _, t := range block {
		b = appendInt(b, t)
	}
	salt := index == 0 && extra.CacheSalt != ""
	// vLLM's generate_block_hash_extra_keys: the LoRA name, then one
	// (identifier, offset relative to the block) tuple per multimodal item
	// overlapping the block, then the salt; None when there are none.
	start := index * h.blockSize
	end := start + len(block)
	mm := 0
	for _, it := range extra.MM {
		if it.Offset < end && start < it.Offset+it.Length {
			mm++
		}
	}
	switch n := boolInt(extra.LoRA != "") + mm + boolInt(salt); n {
	case 0:
		b = append(b, cborNull)
	default:
		b = appendHead(b, majorArray, uint64(n))
		if extra.LoRA != "" {
			b = appendHead(b, majorText, uint64(len(extra.LoRA)))
			b = append(b, extra.LoRA...)
		}
		for _, it := range extra.MM {
			if it.Offset < end && start < it.Offset+it.Length {
				b = append(b, majorArray|2)
				b = appendHead(b, majorText, uint64(len(it.Identifier)))
				b = append(b, it.Identifier...)
				b = appendInt(b, it.Offset-start)
			}
		}
		if salt {
			b = appendHead(b, majorText, uint64(len(extra.CacheSalt)))
			b = append(b, extra.CacheSalt...)
		}
	}
	return sha256.Sum256(b)
}

// encodingBuffer is the stack room for one block's CBOR encoding.
const encodingBuffer = 512

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
