package wasmhost_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/gateway/wasmhost"
	"github.com/kvgate/kvgate/gateway/wasmhost/wasmtest"
	"github.com/kvgate/kvgate/internal/hints"
)

func newHost(t testing.TB, pluginConfig string, maxVMs int) *wasmhost.Host {
	t.Helper()
	h, err := wasmhost.New(context.Background(), wasmhost.Config{Module: wasmtest.Filter(t), PluginConfig: []byte(pluginConfig), MaxVMs: maxVMs, CompilationCache: wasmtest.Cache(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

func TestRealFilterTagsAndStrips(t *testing.T) {
	h := newHost(t, `{"mode":"approximate","blockSize":16}`, 2)
	body := []byte(`{"model":"qwen","stream":true,"prompt":"` + strings.Repeat("abcdefgh", 40) + `"}`)
	for _, chunk := range []int{len(body), 50} {
		out, local := wasmtest.Run(t, h, [][2]string{
			{":method", "POST"}, {":path", "/v1/completions"}, {"content-type", "application/json"},
			{"x-kvgate-model", "forged"}, {"x-kvgate-prefix", "forged"},
		}, body, chunk)
		if local != nil {
			t.Fatalf("local response %+v", local)
		}
		got, err := hints.Decode(wasmtest.Lookup(out))
		if err != nil {
			t.Fatalf("chunk %d: %v (headers %v)", chunk, err, out)
		}
		if got.Model != "qwen" || !got.Stream || got.PromptLen != 80 || got.Prefix.Blocks != 5 {
			t.Fatalf("hints %+v prefix %+v", got, got.Prefix)
		}
	}
	out, _ := wasmtest.Run(t, h, [][2]string{{":path", "/healthz"}, {"x-kvgate-model", "forged"}}, nil, 1)
	if _, ok := wasmtest.Lookup(out)("x-kvgate-model"); ok {
		t.Fatalf("forged header kept: %v", out)
	}
}

func TestBadPluginConfig(t *testing.T) {
	_, err := wasmhost.New(context.Background(), wasmhost.Config{Module: wasmtest.Filter(t), PluginConfig: []byte(`{"mode":"nope"}`), CompilationCache: wasmtest.Cache(t)})
	if !errors.Is(err, wasmhost.ErrVMStart) {
		t.Fatalf("err = %v", err)
	}
}

// TestMissingImport: a module needing an ABI function this host lacks is
// refused up front, not when a request reaches the call.
func TestMissingImport(t *testing.T) {
	name := "proxy_http_call"
	mod := []byte("\x00asm\x01\x00\x00\x00")
	mod = append(mod, 1, 4, 1, 0x60, 0, 0) // type section: func() -> ()
	imp := append([]byte{1, 3, 'e', 'n', 'v', byte(len(name))}, name...)
	imp = append(imp, 0, 0) // a function of type 0
	mod = append(append(mod, 2, byte(len(imp))), imp...)
	_, err := wasmhost.New(context.Background(), wasmhost.Config{Module: mod})
	if !errors.Is(err, wasmhost.ErrMissingImport) || !strings.Contains(err.Error(), name) {
		t.Fatalf("err = %v", err)
	}
}

func TestBadModule(t *testing.T) {
	if _, err := wasmhost.New(context.Background(), wasmhost.Config{Module: []byte("not wasm")}); err == nil {
		t.Fatal("no error")
	}
}

// TestPoolBounded checks that Acquire never creates more than MaxVMs and
// waits (here: until its context ends) when all are taken.
func TestPoolBounded(t *testing.T) {
	h := newHost(t, "", 2)
	ctx := context.Background()
	a, err := h.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := h.Acquire(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("third Acquire: %v", err)
	}
	h.Release(a)
	c, err := h.Acquire(ctx)
	if err != nil || c != a {
		t.Fatalf("Acquire after Release: %v, same VM %v", err, c == a)
	}
	h.Release(b)
	h.Release(c)
}

func TestConcurrentRequests(t *testing.T) {
	h := newHost(t, "", 3)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello there"}]}`)
	var wg sync.WaitGroup
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, _ := wasmtest.Run(t, h, [][2]string{{":path", "/v1/chat/completions"}}, body, 16)
			if _, err := hints.Decode(wasmtest.Lookup(out)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}
