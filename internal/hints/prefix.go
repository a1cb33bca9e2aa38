package hints

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// Mode says how the prefix block hashes were computed.
type Mode byte

const (
	// Approximate: prefixhash over prompt text, blocks of BlockSize×4 bytes.
	Approximate Mode = 'a'
	// Precise: vLLM's block hashes over BlockSize tokens.
	Precise Mode = 'p'
)

// String returns the configuration name of the mode.
func (m Mode) String() string {
	switch m {
	case Approximate:
		return "approximate"
	case Precise:
		return "precise"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode maps a configuration name to a Mode.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "approximate":
		return Approximate, nil
	case "precise":
		return Precise, nil
	}
	return 0, fmt.Errorf("hints: unknown prefix mode %q", s)
}

// Limits that bound the header and the decoder's work.
const (
	// MaxSamples bounds the sampled hashes per header: 600 × 11 characters
	// keeps x-kvgate-prefix under 7 KB.
	MaxSamples = 600
	// MaxBlocks bounds n; 2^24 blocks of 16 tokens are 268M tokens.
	MaxBlocks = 1 << 24
	// MaxDense bounds k.
	MaxDense = 4096
	// MaxBlockSize bounds the block size in tokens.
	MaxBlockSize = 1 << 16
)

const hashChars = 11 // unpadded base64 of 8 bytes

// b64 is strict so that a non-canonical last character (stray low bits)
// is an error and each hash has one spelling.
var b64 = base64.RawURLEncoding.Strict()

// Sample is one sampled block: its index in the prompt and its chained hash.
type Sample struct {
	Index int
	Hash  uint64
}

// Prefix is the decoded x-kvgate-prefix header.
type Prefix struct {
	Mode      Mode
	BlockSize int
	Seed      uint64
	// Blocks is n, the number of hashed blocks.
	Blocks int
	// Dense is k, see the package comment.
	Dense int
	// Samples are in increasing Index order.
	Samples []Sample
}

// NewPrefix samples hashes (all n hashed blocks, in order) with the largest
// k ≤ maxDense whose sample fits in MaxSamples. It returns an error only for
// parameters outside the limits above.
func NewPrefix(mode Mode, blockSize int, seed uint64, hashes []uint64, maxDense int) (Prefix, error) {
	return NewPrefixInto(nil, mode, blockSize, seed, hashes, maxDense)
}

// NewPrefixInto is NewPrefix with the samples written over samples'
// backing array when it is large enough, for callers that reuse one
// prefix per request.
func NewPrefixInto(samples []Sample, mode Mode, blockSize int, seed uint64, hashes []uint64, maxDense int) (Prefix, error) {
	n := len(hashes)
	switch {
	case mode != Approximate && mode != Precise:
		return Prefix{}, fmt.Errorf("hints: unknown mode %v", mode)
	case blockSize < 1 || blockSize > MaxBlockSize:
		return Prefix{}, fmt.Errorf("hints: block size %d out of range", blockSize)
	case n > MaxBlocks:
		return Prefix{}, fmt.Errorf("hints: %d blocks exceed %d", n, MaxBlocks)
	case maxDense < 1:
		return Prefix{}, fmt.Errorf("hints: dense limit %d < 1", maxDense)
	}
	k := min(maxDense, MaxDense)
	if SampleCount(n, k) > MaxSamples {
		// SampleCount grows with k: find the largest k that fits. k = 1
		// always fits for n ≤ MaxBlocks (about 2·log2(n) samples).
		lo, hi := 1, k
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if SampleCount(n, mid) <= MaxSamples {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		k = lo
	}
	p := Prefix{Mode: mode, BlockSize: blockSize, Seed: seed, Blocks: n, Dense: k}
	p.Samples = samples[:0]
	if c := SampleCount(n, k); cap(p.Samples) < c {
		p.Samples = make([]Sample, 0, c)
	}
	forEachSample(n, k, func(i int) {
		p.Samples = append(p.Samples, Sample{Index: i, Hash: hashes[i]})
	})
	return p, nil
}

// forEachSample calls f with each sampled index of n blocks in increasing
// order: region j starts at (2^j−1)·k and holds k indices at stride 2^j;
// the last block is always included.
func forEachSample(n, k int, f func(int)) {
	last := -1
	for start, stride := 0, 1; start < n; start, stride = start+k*stride, stride*2 {
		for m := 0; m < k; m++ {
			i := start + m*stride
			if i >= n {
				break
			}
			f(i)
			last = i
		}
	}
	if n > 0 && last != n-1 {
		f(n - 1)
	}
}

// SampleCount is how many samples n blocks with dense limit k produce.
func SampleCount(n, k int) int {
	c := 0
	forEachSample(n, k, func(int) { c++ })
	return c
}

// Encode renders the header value.
func (p Prefix) Encode() string {
	var b strings.Builder
	b.Grow(64 + len(p.Samples)*hashChars)
	b.WriteString("1;m=")
	b.WriteByte(byte(p.Mode))
	b.WriteString(";b=")
	b.WriteString(strconv.Itoa(p.BlockSize))
	b.WriteString(";s=")
	var seed [16]byte
	b.Write(strconv.AppendUint(seed[:0], p.Seed, 16))
	b.WriteString(";n=")
	b.WriteString(strconv.Itoa(p.Blocks))
	b.WriteString(";k=")
	b.WriteString(strconv.Itoa(p.Dense))
	b.WriteString(";h=")
	var raw [8]byte
	var enc [hashChars]byte
	for _, s := range p.Samples {
		binary.BigEndian.PutUint64(raw[:], s.Hash)
		b64.Encode(enc[:], raw[:])
		b.Write(enc[:])
	}
	return b.String()
}

// DecodePrefix parses an x-kvgate-prefix value. Errors wrap ErrMalformed.
func DecodePrefix(v string) (Prefix, error) {
	bad := func(what string) (Prefix, error) {
		return Prefix{}, fmt.Errorf("%w: %s: %s", ErrMalformed, HeaderPrefixKey, what)
	}
	fields := strings.Split(v, ";")
	if len(fields) != 7 || fields[0] != "1" {
		return bad("want version 1 and 6 fields")
	}
	val := func(i int, key string) (string, bool) {
		return strings.CutPrefix(fields[i], key+"=")
	}
	var p Prefix
	m, ok := val(1, "m")
	if !ok || len(m) != 1 || (Mode(m[0]) != Approximate && Mode(m[0]) != Precise) {
		return bad("mode")
	}
	p.Mode = Mode(m[0])
	var err error
	ints := []struct {
		field  int
		key    string
		dst    *int
		lo, hi int
	}{{2, "b", &p.BlockSize, 1, MaxBlockSize}, {4, "n", &p.Blocks, 0, MaxBlocks}, {5, "k", &p.Dense, 1, MaxDense}}
	for _, f := range ints {
		s, ok := val(f.field, f.key)
		if !ok {
			return bad("field " + f.key)
		}
		if *f.dst, err = parseCount(HeaderPrefixKey, s); err != nil {
			return Prefix{}, err
		}
		if *f.dst < f.lo || *f.dst > f.hi {
			return bad(f.key + " out of range")
		}
	}
	s, ok := val(3, "s")
	if !ok || len(s) == 0 || len(s) > 16 || (len(s) > 1 && s[0] == '0') || strings.ToLower(s) != s {
		return bad("seed")
	}
	if p.Seed, err = strconv.ParseUint(s, 16, 64); err != nil {
		return bad("seed")
	}
	h, ok := val(6, "h")
	if !ok {
		return bad("field h")
	}
	want := SampleCount(p.Blocks, p.Dense)
	if want > MaxSamples || len(h) != want*hashChars {
		return bad(fmt.Sprintf("want %d hashes", want))
	}
	p.Samples = make([]Sample, 0, want)
	var raw [8]byte
	off := 0
	var decErr error
	forEachSample(p.Blocks, p.Dense, func(i int) {
		if decErr != nil {
			return
		}
		if _, err := b64.Decode(raw[:], []byte(h[off:off+hashChars])); err != nil {
			decErr = err
			return
		}
		p.Samples = append(p.Samples, Sample{Index: i, Hash: binary.BigEndian.Uint64(raw[:])})
		off += hashChars
	})
	if decErr != nil {
		return bad("hash: " + decErr.Error())
	}
	return p, nil
}

// MatchedBlocks is the picker's lower bound on the cached prefix, in
// blocks: the index+1 of the last sample before the first one cached
// reports missing. Chaining makes a hit on block i imply blocks 0..i.
func (p Prefix) MatchedBlocks(cached func(hash uint64) bool) int {
	matched := 0
	for _, s := range p.Samples {
		if !cached(s.Hash) {
			break
		}
		matched = s.Index + 1
	}
	return matched
}
