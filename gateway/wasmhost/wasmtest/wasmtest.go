// Package wasmtest gives tests the real kvgate filter: built from source
// with GOOS=wasip1 once per test binary (or read from $KVGATE_FILTER_WASM,
// for machines without a Go toolchain), and compiled by wazero once per
// machine through a compilation cache on disk (compiling the Go-built
// module takes tens of seconds under the race detector).
package wasmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/tetratelabs/wazero"
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
