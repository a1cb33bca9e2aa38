package tokenizer

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// englishText returns about n bytes of English prose (the vLLM test vector's
// prompt, repeated).
func englishText(tb testing.TB, n int) string {
	tb.Helper()
	vec := testutil.LoadHashVector(tb)
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(vec.Prompt)
		b.WriteString("\n\n")
	}
	return b.String()[:n]
}

func BenchmarkEncodeEnglish(b *testing.B) {
	tok := qwen3(b)
	text := englishText(b, 64<<10)
	tok.Encode(text) // warm the word cache, as a long-running picker would be
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for b.Loop() {
		tok.Encode(text)
	}
}

func BenchmarkEncodeEnglishCold(b *testing.B) {
	tok := qwen3(b)
	text := englishText(b, 64<<10)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		cold := *tok
		cold.words = newWordCache(DefaultWordCacheSize)
		cold.Encode(text)
	}
}
