// Package testutil finds what tests share: the repository root, the
// read-only shared/ folder beside it (real traces and test vectors from
// outside the project), the vLLM block-hash test vector, and the tokenizer
// files that `make setup` installs; an SSE reader (the events of a live
// stream, the data payloads of a body, when a stream's first event came)
// and a model-server stand-in and load that check streamed answers arrive
// whole; WaitFor, the bounded poll; the --memory-limit check of the
// commands; the agent-style chat body the filter's benchmarks share; and
// RefusedAddr, a loopback port that refuses connections and stays held;
// AllocatedPerByte, the heap bytes a function allocates per payload byte;
// Collected, whether only a pool, if anything, kept a weakly held value.
package testutil

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/repo"
)

// RepoRoot walks up from the test's working directory to the folder holding
// go.mod.
func RepoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := FindRepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	return dir
}

// FindRepoRoot is RepoRoot for callers without a testing.TB (TestMain).
func FindRepoRoot() (string, error) { return repo.Root() }

// SharedDir is <repo>/../shared; the test is skipped where it is absent
// (a checkout outside this workplace).
func SharedDir(tb testing.TB) string {
	tb.Helper()
	d := filepath.Join(RepoRoot(tb), "..", "shared")
	if _, err := os.Stat(d); err != nil {
		tb.Skipf("shared folder not found at %s", d)
	}
	return d
}

// HashVector is shared/testdata/vllm_kv_hash_qwen3.json: a prompt, its
// Qwen3 token ids and the block hashes real vLLM published for them.
type HashVector struct {
	Model       string   `json:"model_name"`
	Prompt      string   `json:"prompt"`
	Seed        string   `json:"hash_seed"`
	BlockSize   int      `json:"block_size"`
	TokenIDs    []int    `json:"token_ids"`
	BlockHashes []uint64 `json:"block_hashes"`
	Medium      string   `json:"medium"`
}

// LoadHashVector reads the vLLM block-hash test vector.
func LoadHashVector(tb testing.TB) HashVector {
	tb.Helper()
	path := filepath.Join(SharedDir(tb), "testdata", "vllm_kv_hash_qwen3.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var v HashVector
	if err := json.Unmarshal(raw, &v); err != nil {
		tb.Fatalf("parse %s: %v", path, err)
	}
	return v
}

// RequireAssets reports whether missing external assets (tokenizer files,
// node) must fail a test instead of skipping it: `make test` sets
// KVGATE_REQUIRE_TOKENIZER=1 after installing them.
func RequireAssets() bool { return os.Getenv("KVGATE_REQUIRE_TOKENIZER") == "1" }

// SkipOrFail skips the test for a missing asset, or fails it when assets
// are required.
func SkipOrFail(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if RequireAssets() {
		tb.Fatalf(format+" (KVGATE_REQUIRE_TOKENIZER=1; run scripts/setup-tokenizer.sh)", args...)
	}
	tb.Skipf(format+" (run scripts/setup-tokenizer.sh)", args...)
}

// TokenizerDir is the Qwen3 tokenizer folder (KVGATE_TOKENIZER_DIR, default
// <repo>/.cache/tokenizers/qwen3); the test skips or fails when it has no
// tokenizer.json.
func TokenizerDir(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv("KVGATE_TOKENIZER_DIR")
	if dir == "" {
		dir = filepath.Join(RepoRoot(tb), ".cache", "tokenizers", "qwen3")
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		SkipOrFail(tb, "tokenizer files not found in %s", dir)
	}
	return dir
}

// SyncBuffer is a bytes.Buffer that a process or logger may write while the
// test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
