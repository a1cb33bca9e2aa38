package tokenizer

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// repoRoot walks up from the package directory to the directory holding go.mod.
func repoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// requireAssets reports whether missing external assets (tokenizer files,
// node) must fail the test instead of skipping it.
func requireAssets() bool { return os.Getenv("KVGATE_REQUIRE_TOKENIZER") == "1" }

func skipOrFail(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if requireAssets() {
		tb.Fatalf(format+" (KVGATE_REQUIRE_TOKENIZER=1; run scripts/setup-tokenizer.sh)", args...)
	}
	tb.Skipf(format+" (run scripts/setup-tokenizer.sh)", args...)
}

func tokenizerDir(tb testing.TB) string {
	if d := os.Getenv("KVGATE_TOKENIZER_DIR"); d != "" {
		return d
	}
	return filepath.Join(repoRoot(tb), ".cache", "tokenizers", "qwen3")
}

var (
	qwenOnce sync.Once
	qwenTok  *Tokenizer
	qwenErr  error
)

// qwen3 loads the Qwen3 tokenizer once per test binary; loading parses 11 MB
// of JSON.
func qwen3(tb testing.TB) *Tokenizer {
	tb.Helper()
	dir := tokenizerDir(tb)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		skipOrFail(tb, "tokenizer files not found in %s", dir)
	}
	qwenOnce.Do(func() { qwenTok, qwenErr = Load(dir) })
	if qwenErr != nil {
		tb.Fatalf("Load(%s): %v", dir, qwenErr)
	}
	return qwenTok
}

// sharedTestdata returns <repo>/../shared/testdata, skipping when absent.
func sharedTestdata(tb testing.TB) string {
	tb.Helper()
	d := filepath.Join(repoRoot(tb), "..", "shared", "testdata")
	if _, err := os.Stat(d); err != nil {
		tb.Skipf("shared test data not found at %s", d)
	}
	return d
}
