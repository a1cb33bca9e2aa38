package tokenizer

import (
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

var (
	qwenOnce sync.Once
	qwenTok  *Tokenizer
	qwenErr  error
)

// qwen3 loads the Qwen3 tokenizer once per test binary; loading parses 11 MB
// of JSON.
func qwen3(tb testing.TB) *Tokenizer {
	tb.Helper()
	dir := testutil.TokenizerDir(tb)
	qwenOnce.Do(func() { qwenTok, qwenErr = Load(dir) })
	if qwenErr != nil {
		tb.Fatalf("Load(%s): %v", dir, qwenErr)
	}
	return qwenTok
}
