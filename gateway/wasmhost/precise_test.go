package wasmhost_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kvgate/kvgate/gateway/wasmhost"
	"github.com/kvgate/kvgate/gateway/wasmhost/wasmtest"
	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/testutil"
)

// preciseHost runs the filter in precise mode with the Qwen3 tokenizer.
func preciseHost(tb testing.TB, seed string) *wasmhost.Host {
	tb.Helper()
	vmConfig := wasmtest.PreciseVMConfig(tb, testutil.TokenizerDir(tb))
	h, err := wasmhost.New(context.Background(), wasmhost.Config{
		Module: wasmtest.Filter(tb), CompilationCache: wasmtest.Cache(tb), MaxVMs: 1,
		VMConfig:     vmConfig,
		PluginConfig: []byte(`{"mode":"precise","blockSize":16,"hashSeed":"` + seed + `"}`),
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

// TestRealFilterPrecise runs precise mode inside wazero: the tokenizer
// arrives through the VM configuration and the hashes must be the ones
// real vLLM published for the test vector.
func TestRealFilterPrecise(t *testing.T) {
	vec := testutil.LoadHashVector(t)
	h := preciseHost(t, vec.Seed)
	body, _ := json.Marshal(map[string]any{"model": vec.Model, "prompt": vec.Prompt})
	out, _ := wasmtest.Run(t, h, [][2]string{{":method", "POST"}, {":path", "/v1/completions"}}, body, 4096)
	got, err := hints.Decode(wasmtest.Lookup(out))
	if err != nil {
		t.Fatalf("%v (headers %v)", err, out)
	}
	for _, s := range got.Prefix.Samples {
		if s.Index < len(vec.BlockHashes) && s.Hash != vec.BlockHashes[s.Index] {
			t.Fatalf("block %d: %d, vLLM %d", s.Index, s.Hash, vec.BlockHashes[s.Index])
		}
	}
	if got.Prefix.Mode != hints.Precise || got.Prefix.Blocks < len(vec.BlockHashes) {
		t.Fatalf("prefix %+v", got.Prefix)
	}
	vm, err := h.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VM memory with the Qwen3 tokenizer: %d MiB", vm.MemoryBytes()>>20)
	h.Release(vm)
}
