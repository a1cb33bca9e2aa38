package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

var fuzzSeeds = []string{
	"", " ", "hello world", "I'm here, they'll go", "  \n\n\t x", "e\u0301\u0323", "<|im_start|>user\nhi<|im_end|>",
	"<|im_end|>\u0301", "你好世界", "👨‍👩‍👧", "123456789", "\r\n\r\n", strings.Repeat(" ", 100) + "x", "a\u00a0\u3000b",
	"\xff\xfe", "'S'LL'Re", "<<|im_start|>", "ſ K",
}

// normalizedSegments is what Decode(Encode(s)) must return: NFC applies to
// the text between added tokens, never across them.
func normalizedSegments(t *Tokenizer, s string) string {
	var b strings.Builder
	for len(s) > 0 {
		at, n, _ := t.added.find(s)
		b.WriteString(norm.NFC.String(s[:at]))
		b.WriteString(s[at : at+n])
		s = s[at+n:]
	}
	return b.String()
}

func FuzzEncode(f *testing.F) {
	tok := qwen3(f)
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("id %d out of range", id)
			}
		}
		if !utf8.ValidString(s) {
			return
		}
		if got, want := tok.Decode(ids), normalizedSegments(tok, s); got != want {
			t.Fatalf("Decode(Encode(%q)) = %q, want %q", s, got, want)
		}
	})
}

// FuzzPrefixCache checks that reusing a cached prefix never changes ids.
func FuzzPrefixCache(f *testing.F) {
	tok := qwen3(f)
	for i, s := range fuzzSeeds {
		f.Add(s, fuzzSeeds[(i+1)%len(fuzzSeeds)], fuzzSeeds[(i+2)%len(fuzzSeeds)])
	}
	f.Fuzz(func(t *testing.T, prefix, a, b string) {
		c := NewPrefixCache(tok, 1<<20)
		c.minNew = 0
		shared := strings.Repeat(prefix+" word ", 8)
		for _, text := range []string{shared + a, shared + b, shared + a + b, shared + a} {
			if got, want := c.Encode(text), tok.Encode(text); !slices.Equal(got, want) {
				t.Fatalf("PrefixCache.Encode(%q) = %v, want %v", text, got, want)
			}
		}
	})
}
