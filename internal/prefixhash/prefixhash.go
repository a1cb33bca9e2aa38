// Package prefixhash computes the approximate prefix-cache block hashes that
// the GIE prefix-cache-scorer uses and that kvgate's wasm filter sends in its
// headers: the prompt text is cut into blocks of a fixed number of bytes and
// each block is hashed with xxhash64, chained with the previous block's hash
// so that one hash identifies the whole prefix up to its block.
//
// It builds for GOOS=wasip1.
package prefixhash

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/kvgate/kvgate/internal/openai"
)

// CharsPerToken is the estimate GIE uses to turn a token block size into a
// character block size.
const CharsPerToken = 4

// Params are the hashing parameters; both sides of a match must agree.
type Params struct {
	// BlockChars is the block size in bytes of prompt text.
	BlockChars int
	// MaxBlocks bounds how many leading blocks are hashed (0 = unbounded).
	MaxBlocks int
}

// Seed is the hash of the first block's parent: the model name and the
// request's cache_salt, so that prefixes of different models or salts never
// match.
func Seed(model, cacheSalt string) uint64 {
	d := xxhash.New()
	_, _ = d.WriteString(model)
	if cacheSalt != "" {
		_, _ = d.Write([]byte{0})
		_, _ = d.WriteString(cacheSalt)
	}
	return d.Sum64()
}

// Blocks returns the chained hashes of text's full blocks. A trailing partial
// block is not hashed: a server caches only full blocks.
func Blocks(p Params, seed uint64, text string) []uint64 {
	if p.BlockChars <= 0 {
		return nil
	}
	n := len(text) / p.BlockChars
	if p.MaxBlocks > 0 && n > p.MaxBlocks {
		n = p.MaxBlocks
	}
	return AppendBlocks(make([]uint64, 0, n), p, seed, text)
}

// AppendBlocks is Blocks appending to dst, for callers that reuse buffers.
func AppendBlocks(dst []uint64, p Params, seed uint64, text string) []uint64 {
	if p.BlockChars <= 0 {
		return dst
	}
	prev := seed
	var parent [8]byte
	d := xxhash.New()
	for i := 0; i+p.BlockChars <= len(text); i += p.BlockChars {
		if p.MaxBlocks > 0 && i/p.BlockChars >= p.MaxBlocks {
			break
		}
		d.Reset()
		binary.LittleEndian.PutUint64(parent[:], prev)
		_, _ = d.Write(parent[:])
		_, _ = d.WriteString(text[i : i+p.BlockChars])
		prev = d.Sum64()
		dst = append(dst, prev)
	}
	return dst
}

// TokenText packs token ids as 4 little-endian bytes each, so that prompts
// given as token ids hash like text at the CharsPerToken estimate.
func TokenText(ids []int) string {
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(id))
	}
	return string(b)
}

// Text is the text r's prefix is hashed over: its prompt text, or, for a
// prompt of token ids, the ids packed by TokenText.
func Text(r *openai.Request) string {
	if text := r.PromptText(); text != "" || len(r.PromptTokenIDs) == 0 {
		return text
	}
	return TokenText(r.PromptTokenIDs)
}

// Request returns the seed and block hashes of r's prefix. The filter and
// the picker's approximate scorer both hash through here, so that their
// hashes agree.
func Request(p Params, r *openai.Request) (seed uint64, hashes []uint64) {
	seed = Seed(r.Model, r.CacheSalt)
	return seed, Blocks(p, seed, Text(r))
}

// AppendRequest is Request appending the hashes to dst.
func AppendRequest(dst []uint64, p Params, r *openai.Request) (seed uint64, hashes []uint64) {
	seed = Seed(r.Model, r.CacheSalt)
	return seed, AppendBlocks(dst, p, seed, Text(r))
}
