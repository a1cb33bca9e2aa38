package kvhash

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// A cached hasher returns exactly the uncached hashes: for prompts that
// share prefixes (hits), diverge in one token (a slot with the same parent
// but other tokens), carry extra keys (never cached) or token ids beyond
// 32 bits, and through a cache so small that blocks keep evicting each
// other.
func TestBlockCacheIdentical(t *testing.T) {
	for _, slots := range []int{1, 1 << 12} {
		plain, _ := New("42", 4)
		cached, _ := New("42", 4)
		c, err := NewBlockCache(4, slots)
		if err != nil {
			t.Fatal(err)
		}
		if err := cached.UseCache(c); err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, uint64(slots)))
		shared := make([]int, 64)
		for i := range shared {
			shared[i] = rng.IntN(1000)
		}
		extras := []Extra{{}, {LoRA: "adapter"}, {CacheSalt: "salt"}, {MM: []MMItem{{Identifier: "img", Offset: 8, Length: 4}}}}
		for n := range 300 {
			tokens := slices.Clone(shared[:rng.IntN(len(shared))])
			if n%3 == 0 && len(tokens) > 0 {
				tokens[rng.IntN(len(tokens))]++
			}
			if n%7 == 0 && len(tokens) > 0 {
				tokens[0] = math.MaxUint32 + 5 // too large to cache
			}
			if n%11 == 0 && len(tokens) > 1 {
				tokens[1] = math.MaxUint32
			}
			if n%13 == 0 && len(tokens) > 2 {
				tokens[2] = 1<<tokenBits - 1 // the largest id an entry holds
			}
			if n%17 == 0 && len(tokens) > 3 {
				tokens[3] = 1 << tokenBits // the smallest it does not
			}
			if n%19 == 0 && len(tokens) > 0 {
				tokens[len(tokens)-1] = -1 - rng.IntN(3)
			}
			for range rng.IntN(12) {
				tokens = append(tokens, rng.IntN(1000))
			}
			extra := extras[n%len(extras)]
			want, got := plain.AppendUint64s(nil, tokens, extra), cached.AppendUint64s(nil, tokens, extra)
			if !slices.Equal(want, got) {
				t.Fatalf("slots %d, prompt %d: cached hashes differ", slots, n)
			}
			if w, g := plain.BlockHashes(tokens, extra), cached.BlockHashes(tokens, extra); !slices.Equal(w, g) {
				t.Fatalf("slots %d, prompt %d: cached block hashes differ", slots, n)
			}
		}
	}
}

func TestBlockCacheRefusesOtherBlockSize(t *testing.T) {
	h, _ := New("42", 16)
	c, _ := NewBlockCache(4, 16)
	if err := h.UseCache(c); err == nil {
		t.Fatal("a cache for 4-token blocks was accepted by a 16-token hasher")
	}
	if _, err := NewBlockCache(0, 16); err == nil {
		t.Fatal("a zero block size was accepted")
	}
}

// Hashers sharing one cache from several goroutines agree with a plain
// hasher (run with -race).
func TestBlockCacheConcurrent(t *testing.T) {
	c, _ := NewBlockCache(16, 64)
	plain, _ := New("42", 16)
	tokens := make([]int, 16*40)
	for i := range tokens {
		tokens[i] = i % 97
	}
	want := plain.AppendUint64s(nil, tokens, Extra{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			h, _ := New("42", 16)
			_ = h.UseCache(c)
			for n := range 50 {
				got := h.AppendUint64s(nil, tokens[:16*(1+(n+g)%40)], Extra{})
				if !slices.Equal(got, want[:len(got)]) {
					t.Error("concurrent cached hashes differ")
					return
				}
			}
		})
	}
	wg.Wait()
}

// Two blocks whose inputs fall in the same set are both kept (a set has
// two ways), and a third replaces the one written less recently: a
// direct-mapped cache would keep evicting one of the two hot blocks.
func TestBlockCacheSetKeepsTwoBlocks(t *testing.T) {
	c, err := NewBlockCache(4, 1) // the fewest sets
	if err != nil {
		t.Fatal(err)
	}
	h, _ := New("42", 4)
	parent := h.None()
	type block struct {
		toks   []int
		packed []uint64
	}
	// Find three blocks of the same set.
	var same []block
	var set uint64
	for n := 0; len(same) < 3; n++ {
		b := block{toks: []int{n, n + 1, n + 2, n + 3}, packed: make([]uint64, c.words32)}
		if !c.pack(b.toks, b.packed) {
			t.Fatal("a small block is not cacheable")
		}
		s := c.set(keyNext(c.start(parent, ""), b.toks))
		if len(same) == 0 {
			set = s
		}
		if s == set {
			same = append(same, b)
		}
	}
	hashOf := func(b block) Hash { return h.HashBlock(parent, b.toks, 0, Extra{}) }
	for _, b := range same[:2] {
		c.put(set, &parent, b.packed, hashOf(b))
	}
	for i, b := range same[:2] {
		if got, ok := c.get(set, &parent, b.packed); !ok || got != hashOf(b) {
			t.Fatalf("block %d of a set holding two: hit %v", i, ok)
		}
	}
	c.put(set, &parent, same[2].packed, hashOf(same[2]))
	if _, ok := c.get(set, &parent, same[0].packed); ok {
		t.Error("the older block survived a third in its set")
	}
	for _, i := range []int{1, 2} {
		if got, ok := c.get(set, &parent, same[i].packed); !ok || got != hashOf(same[i]) {
			t.Errorf("block %d lost", i)
		}
	}
	// Another parent with the same tokens is another block.
	other := hashOf(same[1])
	if _, ok := c.get(set, &other, same[1].packed); ok {
		t.Error("a block hit under another parent")
	}
}

// pack's unrolled turns must place every token of any block size as one
// token at a time would, and refuse ids outside [0, 2^21) wherever they
// sit in the block.
func TestPackEveryBlockSize(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for bs := 1; bs <= 40; bs++ {
		c, err := NewBlockCache(bs, 64)
		if err != nil {
			t.Fatal(err)
		}
		block := make([]int, bs)
		for i := range block {
			block[i] = rng.IntN(1 << tokenBits)
		}
		want := make([]uint64, c.words32)
		for i, tok := range block {
			want[i/3] |= uint64(tok) << (tokenBits * (i % 3))
		}
		got := make([]uint64, c.words32)
		if !c.pack(block, got) || !slices.Equal(got, want) {
			t.Fatalf("block size %d: packed %x, want %x", bs, got, want)
		}
		for i := range block {
			for _, bad := range []int{1 << tokenBits, -1} {
				old := block[i]
				block[i] = bad
				if c.pack(block, got) {
					t.Fatalf("block size %d: id %d at %d packed", bs, bad, i)
				}
				block[i] = old
			}
		}
	}
}

// keyNext's unrolled turns sum the same pairs as one pair at a time, for
// every block length (the sets of blocks cached before and after agree).
func TestKeyNextEveryLength(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for n := 0; n <= 40; n++ {
		block := make([]int, n)
		for i := range block {
			block[i] = rng.IntN(1 << 30)
		}
		var acc uint64
		for i := 0; i < n; i += 2 {
			v := uint64(block[i])
			if i+1 < n {
				v |= uint64(block[i+1]) << 32
			}
			acc += (v + uint64(i)) * 0x9e3779b97f4a7c15
		}
		k := uint64(0x1234)
		want := (k ^ acc) * 0xbf58476d1ce4e5b9
		want ^= want >> 31
		if got := keyNext(k, block); got != want {
			t.Fatalf("length %d: key %x, want %x", n, got, want)
		}
	}
}
