package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestPrefixCacheMatchesEncode encodes families of texts that share random
// prefixes and checks every result against a full Encode.
func TestPrefixCacheMatchesEncode(t *testing.T) {
	tok := qwen3(t)
	rng := rand.New(rand.NewPCG(7, 8))
	corpus := generateCorpus(200)
	randText := func(k int) string {
		var b strings.Builder
		for ; k > 0; k-- {
			b.WriteString(corpus[rng.IntN(len(corpus))])
			if rng.IntN(3) == 0 {
				b.WriteByte(' ')
			}
		}
		return b.String()
	}
	c := NewPrefixCache(tok, 1<<20)
	c.minNew = 0 // these texts are short; cache them all
	var prefixes []string
	hits := 0
	for i := 0; i < 400; i++ {
		var text string
		switch {
		case len(prefixes) == 0 || rng.IntN(4) == 0:
			text = randText(1 + rng.IntN(20))
			prefixes = append(prefixes, text)
		default:
			p := prefixes[rng.IntN(len(prefixes))]
			cut := rng.IntN(len(p) + 1) // any byte offset, even inside a rune
			text = p[:cut] + randText(rng.IntN(4))
			if rng.IntN(5) == 0 {
				text = p // exact repeat
			}
		}
		if e, _ := c.reuse(text); e != nil {
			hits++
		}
		want := tok.Encode(text)
		if got := c.Encode(text); !slices.Equal(got, want) && len(want)+len(got) > 0 {
			t.Fatalf("text %d %q:\n got %v\nwant %v", i, text, got, want)
		}
	}
	if hits < 100 {
		t.Errorf("only %d of 400 texts reused a cached prefix", hits)
	}
	t.Logf("%d of 400 texts reused a cached prefix", hits)
}

func TestPrefixCacheReuses(t *testing.T) {
	tok := qwen3(t)
	c := NewPrefixCache(tok, 1<<20)
	system := "<|im_start|>system\n" + englishText(t, 20000) + "<|im_end|>\n"
	c.Encode(system + "<|im_start|>user\nfirst question<|im_end|>\n")
	text := system + "<|im_start|>user\nsecond question<|im_end|>\n"
	e, hit := c.reuse(text)
	if e == nil || e.cps[hit].pos < len(system) {
		t.Fatalf("reused prefix does not reach past the system prompt (%d bytes)", len(system))
	}
	cp := e.cps[hit]
	ids := make([]int, cp.ntok)
	for i, id := range e.ids[:cp.ntok] {
		ids[i] = int(id)
	}
	if want := tok.Encode(text[:cp.pos]); !slices.Equal(ids, want) {
		t.Fatal("reused ids differ from Encode of the prefix")
	}
}

func TestPrefixCacheBounded(t *testing.T) {
	tok := qwen3(t)
	const budget = 64 << 10
	c := NewPrefixCache(tok, budget)
	base := englishText(t, 8000)
	for i := 0; i < 50; i++ {
		c.Encode(fmt.Sprintf("%d %s", i, base))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bytes > budget {
		t.Errorf("cache holds %d bytes, budget %d", c.bytes, budget)
	}
	refs := 0
	for _, e := range c.index {
		if e.elem == nil {
			t.Fatal("index points at an entry that was never stored")
		}
		refs++
	}
	entries := c.lru.Len()
	if entries == 0 || entries >= 50 {
		t.Errorf("%d entries after 50 texts of %d bytes", entries, len(base))
	}
	if refs == 0 {
		t.Error("empty index")
	}
}

func TestPrefixCacheConcurrent(t *testing.T) {
	tok := qwen3(t)
	c := NewPrefixCache(tok, 256<<10)
	system := englishText(t, 6000)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				text := fmt.Sprintf("%s user %d asks question %d", system, g, i)
				if got, want := c.Encode(text), tok.Encode(text); !slices.Equal(got, want) {
					t.Errorf("goroutine %d text %d differs", g, i)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkPrefixCache is the picker's hot path: a 24 KB shared system
// prompt followed by a 200-byte request-specific suffix.
func BenchmarkPrefixCache(b *testing.B) {
	tok := qwen3(b)
	c := NewPrefixCache(tok, 64<<20)
	prefix := englishText(b, 24<<10)
	suffix := englishText(b, 200)
	c.Encode(prefix + "warm up")
	// Distinct request texts, built up front so that building them is not
	// measured; each repeats only after many others, as in a busy picker.
	texts := make([]string, 256)
	for i := range texts {
		texts[i] = fmt.Sprintf("%s%08d%s", prefix, i, suffix)
	}
	b.SetBytes(int64(len(texts[0])))
	i := 0
	for b.Loop() {
		c.Encode(texts[i%len(texts)])
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/call")
}
