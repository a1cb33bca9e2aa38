package prompt

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// countingEncoder records how much text was encoded.
type countingEncoder struct {
	enc   Encoder
	bytes int
}

func (c *countingEncoder) Encode(text string) []int {
	c.bytes += len(text)
	return c.enc.Encode(text)
}

// TestTokensUpTo (Medium): a huge prompt costs what its first max tokens
// cost, and those tokens are the full encoding's.
func TestTokensUpTo(t *testing.T) {
	tok, err := tokenizer.Load(testutil.TokenizerDir(t))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := 0; b.Len() < 96<<10; i++ {
		fmt.Fprintf(&b, "Paragraph %d: the prefix cache keeps KV blocks of shared prompts, über alles — 缓存 %d.\n", i, i*7)
	}
	long := b.String()
	for _, tc := range []struct {
		name   string
		prompt string
		max    int
		trunc  bool
	}{
		{"huge prompt", long, 2000, true},
		{"short prompt", "a short prompt", 2000, false},
		{"cut inside multi-byte runes", strings.Repeat("缓存", 12_000), 500, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &openai.Request{API: openai.Completions, Prompt: tc.prompt}
			full, err := Tokens(tok, tok, req)
			if err != nil {
				t.Fatal(err)
			}
			ce := &countingEncoder{enc: tok}
			got, truncated, err := TokensUpTo(ce, tok, req, tc.max)
			if err != nil {
				t.Fatal(err)
			}
			if truncated != tc.trunc || !slices.Equal(got, full[:min(len(full), tc.max)]) {
				t.Fatalf("truncated=%v, %d ids; equal to the full encoding's prefix: %v",
					truncated, len(got), slices.Equal(got, full[:min(len(full), tc.max)]))
			}
			if bound := 2 * (tc.max + tailMargin) * bytesPerTokenGuess; tc.trunc && ce.bytes > bound {
				t.Fatalf("encoded %d bytes of a %d-byte prompt for %d tokens", ce.bytes, len(tc.prompt), tc.max)
			}
		})
	}
	ids, truncated, _ := TokensUpTo(tok, tok, &openai.Request{PromptTokenIDs: []int{1, 2, 3, 4}}, 2)
	if !slices.Equal(ids, []int{1, 2}) || !truncated {
		t.Fatalf("token-id prompt: %v %v", ids, truncated)
	}
}
