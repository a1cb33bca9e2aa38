package kvhash

import (
	"crypto/sha256"
	"encoding/hex"
	"runtime"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// vector is the part of shared/testdata/vllm_kv_hash_qwen3.json the tests
// use: what a real vLLM emitted for the prompt's token ids.
func TestNoneHash(t *testing.T) {
	const want = "9fa6eb003f14425eb9c8e6baacfbcaab26257357b829c7bfa74ffcc4f31c1780"
	if got := NoneHash("42").String(); got != want {
		t.Fatalf("NoneHash(42) = %s, want %s", got, want)
	}
}

func TestVector(t *testing.T) {
	v := testutil.LoadHashVector(t)
	h, err := New(v.Seed, v.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.BlockHashes) != 25 {
		t.Fatalf("vector has %d hashes, want 25", len(v.BlockHashes))
	}
	full := h.BlockHashes(v.TokenIDs, Extra{})
	u := h.AppendUint64s(nil, v.TokenIDs, Extra{})
	if len(full) != len(v.BlockHashes) || len(u) != len(v.BlockHashes) {
		t.Fatalf("got %d/%d hashes, want %d", len(full), len(u), len(v.BlockHashes))
	}
	for i, want := range v.BlockHashes {
		if full[i].Uint64() != want || u[i] != want {
			t.Errorf("block %d: got %d / %d, want %d", i, full[i].Uint64(), u[i], want)
		}
	}
}

// TestIncremental hashes a sequence in uneven pieces, as an engine does while
// a request decodes, and expects the one-shot chain.
// With a BlockCache too, with and without extra keys (a continued chain
// picks up its rolling cache key from the tokens before it).
func TestIncremental(t *testing.T) {
	v := testutil.LoadHashVector(t)
	plain, err := New(v.Seed, v.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	cached, _ := New(v.Seed, v.BlockSize)
	c, _ := NewBlockCache(v.BlockSize, 1<<10)
	if err := cached.UseCache(c); err != nil {
		t.Fatal(err)
	}
	for _, extra := range []Extra{{LoRA: "alice", CacheSalt: "s"}, {CacheSalt: "s"}, {}} {
		want := plain.BlockHashes(v.TokenIDs, extra)
		for pass, h := range []*Hasher{plain, cached, cached} { // the second cached pass hits
			var got []Hash
			for _, n := range []int{0, 7, 16, 17, 100, 101, 250, 399, 400} {
				got = h.AppendBlockHashes(got, v.TokenIDs[:n], extra)
				if len(got) != n/v.BlockSize {
					t.Fatalf("after %d tokens: %d hashes, want %d", n, len(got), n/v.BlockSize)
				}
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("extra %+v, pass %d: block %d differs from the one-shot chain", extra, pass, i)
				}
			}
		}
	}
}

func TestExtraKeys(t *testing.T) {
	v := testutil.LoadHashVector(t)
	h, err := New(v.Seed, v.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	tokens := v.TokenIDs[:64]
	base := h.BlockHashes(tokens, Extra{})
	tests := []struct {
		name  string
		extra Extra
	}{
		{"lora", Extra{LoRA: "alice"}},
		{"salt", Extra{CacheSalt: "tenant-a"}},
		{"lora and salt", Extra{LoRA: "alice", CacheSalt: "tenant-a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := h.BlockHashes(tokens, tc.extra)
			for i := range got {
				if got[i] == base[i] {
					t.Errorf("block %d unchanged by %+v", i, tc.extra)
				}
			}
		})
	}

	// The salt enters block 0 only: hashing block 1 on the salted parent
	// without extra keys must give the salted chain's block 1.
	salted := h.BlockHashes(tokens, Extra{CacheSalt: "tenant-a"})
	bs := h.BlockSize()
	if got := h.HashBlock(salted[0], tokens[bs:2*bs], 1, Extra{CacheSalt: "tenant-a"}); got != salted[1] {
		t.Error("salt leaked past block 0")
	}
	if got := h.HashBlock(salted[0], tokens[bs:2*bs], 1, Extra{}); got != salted[1] {
		t.Error("block 1 of a salted chain should not depend on the salt")
	}
	// The LoRA name enters every block.
	lora := h.BlockHashes(tokens, Extra{LoRA: "alice"})
	if got := h.HashBlock(lora[0], tokens[bs:2*bs], 1, Extra{}); got == lora[1] {
		t.Error("LoRA name missing from block 1")
	}
}

// TestCBOR pins the encoder against hand-checked canonical CBOR (RFC 8949
// Appendix A examples).
func TestCBOR(t *testing.T) {
	tests := []struct {
		v    int
		want string
	}{
		{0, "00"}, {23, "17"}, {24, "1818"}, {255, "18ff"}, {256, "190100"},
		{65535, "19ffff"}, {65536, "1a00010000"}, {1 << 32, "1b0000000100000000"},
		{-1, "20"}, {-100, "3863"},
	}
	for _, tc := range tests {
		if got := hex.EncodeToString(appendInt(nil, tc.v)); got != tc.want {
			t.Errorf("appendInt(%d) = %s, want %s", tc.v, got, tc.want)
		}
	}
}

func TestNewRejectsBlockSize(t *testing.T) {
	for _, bs := range []int{0, -16} {
		if _, err := New("42", bs); err == nil {
			t.Errorf("New(42, %d) accepted", bs)
		}
	}
}

func TestShortSequences(t *testing.T) {
	h, err := New("42", 16)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 15} {
		if got := h.BlockHashes(make([]int, n), Extra{}); len(got) != 0 {
			t.Errorf("%d tokens gave %d hashes", n, len(got))
		}
	}
}

// BenchmarkBlockHashes hashes a 6,000-token prompt, the size of the shared
// prefixes in the llm-d precise-routing benchmark.
func BenchmarkBlockHashes(b *testing.B) {
	h, err := New("42", 16)
	if err != nil {
		b.Fatal(err)
	}
	benchBlockHashes(b, h, 1)
}

// BenchmarkBlockHashesCached is BenchmarkBlockHashes for a prompt whose
// blocks a BlockCache holds: a shared prefix seen before.
func BenchmarkBlockHashesCached(b *testing.B) {
	benchBlockHashes(b, cachedHasher(b, 1<<12), 1)
}

// BenchmarkBlockHashesCachedCold is BenchmarkBlockHashesCached rotating
// over 64 such prompts (24,000 blocks, 3 MB of entries): every block is
// cached, but its entry has left the processor's nearer caches since the
// prompt was last hashed, as between a picker's decisions.
func BenchmarkBlockHashesCachedCold(b *testing.B) {
	benchBlockHashes(b, cachedHasher(b, 1<<16), 64)
}

func cachedHasher(b *testing.B, slots int) *Hasher {
	h, _ := New("42", 16)
	c, err := NewBlockCache(16, slots)
	if err != nil {
		b.Fatal(err)
	}
	if err := h.UseCache(c); err != nil {
		b.Fatal(err)
	}
	return h
}

// benchBlockHashes hashes n 6,000-token prompts in turn with h, each once
// before the timer starts (which fills h's cache, if it has one).
// cpu-ns/block is the thread's CPU time, which leaves out other
// processes' turns on a shared machine.
func benchBlockHashes(b *testing.B, h *Hasher, n int) {
	prompts := make([][]int, n)
	for p := range prompts {
		prompts[p] = make([]int, 6000)
		for i := range prompts[p] {
			prompts[p][i] = (i*7919 + p*104729) % 151643
		}
	}
	dst := make([]uint64, 0, 6000/16)
	for _, p := range prompts {
		dst = h.AppendUint64s(dst[:0], p, Extra{})
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	c0, ok := testutil.ThreadCPU()
	i := 0
	for b.Loop() {
		dst = h.AppendUint64s(dst[:0], prompts[i%n], Extra{})
		i++
	}
	blocks := float64(6000 / 16)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/blocks, "ns/block")
	if c1, _ := testutil.ThreadCPU(); ok {
		b.ReportMetric(float64((c1-c0).Nanoseconds())/float64(b.N)/blocks, "cpu-ns/block")
	}
}

// TestMultimodalExtraKeys pins vLLM's multimodal extra keys
// (kv_cache_utils.generate_block_hash_extra_keys): LoRA name, then one
// (identifier, item offset − block start) per item overlapping the block,
// then the salt on block 0; against hand-written canonical CBOR.
func TestMultimodalExtraKeys(t *testing.T) {
	h, err := New("42", 4)
	if err != nil {
		t.Fatal(err)
	}
	extra := Extra{LoRA: "l", CacheSalt: "s", MM: []MMItem{{Identifier: "ab", Offset: 2, Length: 5}}}
	tokens := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	got := h.BlockHashes(tokens, extra)
	want := func(parent Hash, toks, extraCBOR string) Hash {
		b, _ := hex.DecodeString("835820" + hex.EncodeToString(parent[:]) + toks + extraCBOR)
		return sha256.Sum256(b)
	}
	b0 := want(h.None(), "8401020304", "83"+"616c"+"82"+"626162"+"02"+"6173")
	b1 := want(b0, "8405060708", "82"+"616c"+"82"+"626162"+"21") // offset 2 − 4 = −2
	b2 := want(b1, "84090a0b0c", "81"+"616c")                    // past the item
	if got[0] != b0 || got[1] != b1 || got[2] != b2 {
		t.Fatalf("hashes\n%v\nwant\n%v", got, []Hash{b0, b1, b2})
	}
	// Another image in the same placeholders is another prefix.
	other := h.BlockHashes(tokens, Extra{LoRA: "l", CacheSalt: "s", MM: []MMItem{{Identifier: "cd", Offset: 2, Length: 5}}})
	if other[0] == got[0] || other[1] == got[1] {
		t.Fatal("a different multimodal item hashed the same")
	}
	// No item, no key: text-only hashes are unchanged.
	if a, b := h.BlockHashes(tokens, Extra{}), h.BlockHashes(tokens, Extra{MM: []MMItem{{Identifier: "x", Offset: 100, Length: 4}}}); a[0] != b[0] || a[2] != b[2] {
		t.Fatal("an item outside the blocks changed their hashes")
	}
}
