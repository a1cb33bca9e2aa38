package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/prompt"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// qwenVMConfig is the VM configuration carrying the Qwen3 tokenizer files.
func qwenVMConfig(t *testing.T) []byte {
	t.Helper()
	dir := testutil.TokenizerDir(t)
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cj, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(vmConfig{Tokenizer: tj, TokenizerConfig: cj})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPreciseMatchesVLLM: in precise mode the filter's hashes are the ones
// real vLLM published for the test vector's prompt.
func TestPreciseMatchesVLLM(t *testing.T) {
	vec := testutil.LoadHashVector(t)
	opt := proxytest.NewEmulatorOption().WithVMContext(&vmContext{}).
		WithVMConfiguration(qwenVMConfig(t)).
		WithPluginConfiguration([]byte(`{"mode":"precise","blockSize":16,"hashSeed":"` + vec.Seed + `"}`))
	host, reset := proxytest.NewHostEmulator(opt)
	defer reset()
	if st := host.StartVM(); st != types.OnVMStartStatusOK {
		t.Fatalf("StartVM: %v %v", st, host.GetCriticalLogs())
	}
	if st := host.StartPlugin(); st != types.OnPluginStartStatusOK {
		t.Fatalf("StartPlugin: %v %v", st, host.GetCriticalLogs())
	}
	body, _ := json.Marshal(map[string]any{"model": vec.Model, "prompt": vec.Prompt})
	out, _ := send(t, host, "/v1/completions", nil, body, 1<<20)
	h, err := hints.Decode(func(k string) (string, bool) { return get(out, k) })
	if err != nil {
		t.Fatal(err)
	}
	p := h.Prefix
	if p.Mode != hints.Precise || h.PromptLen < len(vec.TokenIDs) || p.Blocks < len(vec.BlockHashes) {
		t.Fatalf("hints %+v prefix %+v", h, p)
	}
	checked := 0
	for _, s := range p.Samples {
		if s.Index < len(vec.BlockHashes) {
			if s.Hash != vec.BlockHashes[s.Index] {
				t.Fatalf("block %d: hash %d, vLLM %d", s.Index, s.Hash, vec.BlockHashes[s.Index])
			}
			checked++
		}
	}
	if checked != len(vec.BlockHashes) {
		t.Fatalf("compared %d of %d blocks", checked, len(vec.BlockHashes))
	}
}

func TestPreciseNeedsTokenizer(t *testing.T) {
	c, err := parseConfig([]byte(`{"mode":"precise","hashSeed":"42"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newPrecise(c, nil); !errors.Is(err, errModeUnavailable) {
		t.Fatalf("precise without tokenizer: %v", err)
	}
	if _, err := loadTokenizer([]byte(`{"tokenizerConfig":{}}`)); err == nil {
		t.Fatal("VM configuration without tokenizer accepted")
	}
}

// countingEncoder counts the token ids an encoder produced.
type countingEncoder struct {
	enc    prompt.Encoder
	tokens int
}

func (c *countingEncoder) Encode(text string) []int {
	ids := c.enc.Encode(text)
	c.tokens += len(ids)
	return ids
}

// TestPreciseTokenizesOnlyTheHashedBlocks (Medium, "precise tokenizing in a
// VM not interruptible"): a prompt of megabytes produces no more tokens
// than the hashed blocks need, and its hashes are those of the full
// encoding's first blocks.
func TestPreciseTokenizesOnlyTheHashedBlocks(t *testing.T) {
	tok, err := tokenizer.Load(testutil.TokenizerDir(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseConfig([]byte(`{"mode":"precise","blockSize":16,"maxPrefixBlocks":64,"hashSeed":"0"}`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPrecise(c, tok)
	if err != nil {
		t.Fatal(err)
	}
	limit := c.MaxPrefixBlocks * c.BlockSize
	var b strings.Builder
	for i := 0; b.Len() < 4<<20; i++ {
		fmt.Fprintf(&b, "Turn %d: the agent re-sends its whole history, tool output included — 缓存 %d.\n", i, i*3)
	}
	huge := b.String()
	count := &countingEncoder{enc: p.enc}
	p.enc = count
	got, promptLen, err := p.hash(&openai.Request{API: openai.Completions, Prompt: huge})
	if err != nil {
		t.Fatal(err)
	}
	// TokensUpTo encodes text cut at 16 bytes per wanted token, doubling
	// the cut at most once for such text: no more tokens than those bytes,
	// where the whole prompt is ~1M tokens.
	if bound := 2 * 16 * (limit + 1024); count.tokens > bound {
		t.Fatalf("encoded %d tokens of a %d-byte prompt for %d hashed tokens (bound %d)", count.tokens, len(huge), limit, bound)
	}
	if got.Blocks != c.MaxPrefixBlocks || promptLen <= limit || promptLen < hints.EstimateTokens(len(huge)) {
		t.Fatalf("%d blocks, prompt length %d (cap %d tokens, estimate %d)", got.Blocks, promptLen, limit, hints.EstimateTokens(len(huge)))
	}
	// The same blocks as a full encoding of a shorter prefix of the text.
	head := huge[:64<<10]
	ids := tok.Encode(head)
	if len(ids) <= limit+1024 {
		t.Fatalf("the head has only %d tokens", len(ids))
	}
	hs := p.hasher.AppendUint64s(nil, ids[:limit], kvhash.Extra{})
	want, err := hints.NewPrefix(hints.Precise, c.BlockSize, p.seedID, hs, c.DenseBlocks)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatal("the huge prompt's hashes differ from the full encoding's first blocks")
	}
	t.Logf("%d-byte prompt: %d tokens encoded for %d hashed; prompt length %d", len(huge), count.tokens, limit, promptLen)

	// A prompt within the cap: exact length, every block.
	short := &openai.Request{API: openai.Completions, Prompt: head[:2000]}
	n := len(tok.Encode(short.Prompt))
	if pr, l, err := p.hash(short); err != nil || l != n || pr.Blocks != n/c.BlockSize {
		t.Fatalf("short prompt: %d blocks, length %d, want %d: %v", pr.Blocks, l, n, err)
	}
}
