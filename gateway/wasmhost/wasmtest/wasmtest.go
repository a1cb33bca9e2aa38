// Package wasmtest gives tests the real kvgate filter: built from source
// with GOOS=wasip1 once per test binary (or read from $KVGATE_FILTER_WASM,
// for machines without a Go toolchain), and compiled by wazero once per
// machine through a compilation cache on disk (compiling the Go-built
// module takes tens of seconds under the race detector).
package wasmtest

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/kvgate/kvgate/gateway/wasmhost"
)

const filterPackage = "github.com/kvgate/kvgate/wasm-filter"

var (
	once   sync.Once
	module []byte
	err    error
	cache  wazero.CompilationCache
)

// Filter returns the filter's .wasm bytes; it skips the test when the
// wasip1 build is impossible here.
func Filter(tb testing.TB) []byte {
	tb.Helper()
	once.Do(build)
	if err != nil {
		tb.Skipf("cannot build %s for wasip1: %v", filterPackage, err)
	}
	return module
}

// Cache is a compilation cache shared by every test process of this user.
func Cache(tb testing.TB) wazero.CompilationCache {
	tb.Helper()
	once.Do(build)
	return cache
}

func build() {
	dir := filepath.Join(os.TempDir(), "kvgate-wazero-cache-"+strconv.Itoa(os.Getuid()))
	if c, cerr := wazero.NewCompilationCacheWithDir(dir); cerr == nil {
		cache = c
	} else {
		cache = wazero.NewCompilationCache()
	}
	if path := os.Getenv("KVGATE_FILTER_WASM"); path != "" {
		module, err = os.ReadFile(path)
		return
	}
	tmp, terr := os.MkdirTemp("", "kvgate-filter")
	if terr != nil {
		err = terr
		return
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "kvgate-filter.wasm")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-buildmode=c-shared", "-o", out, filterPackage)
	// As the Makefile builds it: jsonv2's decoder makes the filter's JSON
	// parsing 5x faster under wasm than encoding/json's per-byte scanner.
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOEXPERIMENT=jsonv2")
	if msg, berr := cmd.CombinedOutput(); berr != nil {
		err = &buildError{msg: string(msg), err: berr}
		return
	}
	module, err = os.ReadFile(out)
}

type buildError struct {
	msg string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.msg }
func (e *buildError) Unwrap() error { return e.err }

// Run passes one request through a filter VM of h, the body in chunks of
// chunk bytes, and returns the request headers as the filter left them and
// its local response, if it sent one.
func Run(tb testing.TB, h *wasmhost.Host, headers [][2]string, body []byte, chunk int) ([][2]string, *wasmhost.LocalResponse) {
	tb.Helper()
	ctx := context.Background()
	vm, err := h.Acquire(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer h.Release(vm)
	s, err := vm.NewStream(ctx, headers)
	if err != nil {
		tb.Fatal(err)
	}
	act, err := s.OnRequestHeaders(ctx, len(body) == 0)
	if err != nil {
		tb.Fatal(err)
	}
	for end := min(chunk, len(body)); act == wasmhost.Pause && s.LocalResponse() == nil && len(body) > 0; end = min(end+chunk, len(body)) {
		if act, err = s.OnRequestBody(ctx, body[:end], end == len(body)); err != nil {
			tb.Fatal(err)
		}
		if end == len(body) {
			break
		}
	}
	out := append([][2]string(nil), s.Headers()...)
	if err := s.Done(ctx); err != nil {
		tb.Fatal(err)
	}
	return out, s.LocalResponse()
}

// Lookup reads a header list the way hints.Decode wants.
func Lookup(hs [][2]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for _, kv := range hs {
			if kv[0] == k {
				return kv[1], true
			}
		}
		return "", false
	}
}

// PreciseVMConfig is the filter's VM configuration for precise mode: the
// tokenizer files from dir, as Envoy's vm_config.configuration carries
// them.
func PreciseVMConfig(tb testing.TB, dir string) []byte {
	tb.Helper()
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		tb.Fatal(err)
	}
	cj, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		tb.Fatal(err)
	}
	vmConfig, err := json.Marshal(map[string]json.RawMessage{"tokenizer": tj, "tokenizerConfig": cj})
	if err != nil {
		tb.Fatal(err)
	}
	return vmConfig
}
