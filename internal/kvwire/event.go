package kvwire

import "encoding/binary"

// Event type names, as vLLM tags them on the wire.
const (
	TypeBlockStored      = "BlockStored"
	TypeBlockRemoved     = "BlockRemoved"
	TypeAllBlocksCleared = "AllBlocksCleared"
)

// Medium names of vLLM's cache tiers.
const (
	MediumGPU = "GPU"
	MediumCPU = "CPU"
)

// MaxRawHashLen bounds the binary block hashes the decoder accepts. vLLM
// sends 32 bytes (sha256, sha256_cbor) or 16 (xxhash's 128-bit digest).
const MaxRawHashLen = 64

// Hash is a block hash in either of vLLM's forms: a 64-bit integer (the
// default) or the raw digest bytes. The zero Hash is the integer 0.
//
// A Hash is 16 bytes, a pointer to the rare digest beside the key rather
// than a string header inline: a batch's hashes are most of what decoding
// it allocates, up to 16 bytes per payload byte (a 1-byte integer hash)
// instead of 24. Compare Hashes by Key and Raw: == compares the pointers.
type Hash struct {
	key uint64
	raw *string // the digest, never empty; nil for the integer form
}

// Uint64Hash returns the integer form.
func Uint64Hash(v uint64) Hash { return Hash{key: v} }

// BytesHash returns the raw form of a digest; b is copied. Empty b gives the
// integer 0, and b is expected to hold at most MaxRawHashLen bytes.
func BytesHash(b []byte) Hash { return rawHash(string(b)) }

func rawHash(raw string) Hash {
	if raw == "" {
		return Hash{}
	}
	return Hash{key: keyOf(raw), raw: &raw}
}

// keyOf is the routing key of a digest: its last 8 bytes big-endian,
// zero-extended when shorter, which for sha256 equals the uint64 vLLM
// publishes in the integer form.
func keyOf(raw string) uint64 {
	var last [8]byte
	copy(last[8-min(8, len(raw)):], raw[max(0, len(raw)-8):])
	return binary.BigEndian.Uint64(last[:])
}

// Key is the uint64 the index routes on: the integer itself, or the
// digest's last 8 bytes big-endian.
func (h Hash) Key() uint64 { return h.key }

// Raw returns the digest of the raw form, or nil for the integer form.
func (h Hash) Raw() []byte {
	if h.raw == nil {
		return nil
	}
	return []byte(*h.raw)
}

// IsRaw tells the raw form from the integer form.
func (h Hash) IsRaw() bool { return h.raw != nil }

// Event is one KV-cache event: BlockStored, BlockRemoved or
// AllBlocksCleared.
type Event interface {
	// Type is the event's wire tag.
	Type() string
}

// BlockStored reports blocks newly cached, in prompt order; each hash
// chains on the previous one and the first on ParentBlockHash.
type BlockStored struct {
	BlockHashes     []Hash
	ParentBlockHash *Hash // nil for a prompt's first block
	TokenIDs        []int
	BlockSize       int
	LoRAID          *int
	Medium          string // "" when not sent (vLLM's GPU cache)
	LoRAName        string // "" when not sent
}

// BlockRemoved reports blocks evicted from a medium.
type BlockRemoved struct {
	BlockHashes []Hash
	Medium      string
}

// AllBlocksCleared reports that the server reset its prefix cache: vLLM
// sends it from its GPU block pool, so it says nothing of the blocks an
// offloading connector holds (events with another Medium).
type AllBlocksCleared struct{}

// Type implements Event.
func (BlockStored) Type() string { return TypeBlockStored }

// Type implements Event.
func (BlockRemoved) Type() string { return TypeBlockRemoved }

// Type implements Event.
func (AllBlocksCleared) Type() string { return TypeAllBlocksCleared }

// EventBatch is one message's payload.
type EventBatch struct {
	TS               float64 // Unix seconds
	Events           []Event
	DataParallelRank *int
}

// Keys appends the routing keys of hashes to dst.
func Keys(dst []uint64, hashes []Hash) []uint64 {
	for _, h := range hashes {
		dst = append(dst, h.key)
	}
	return dst
}
