package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/testutil"
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
