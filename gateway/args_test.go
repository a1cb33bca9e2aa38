package gateway

import (
	"io"
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/cliflag/cliflagtest"
	"github.com/kvgate/kvgate/internal/memlimit"
	"github.com/kvgate/kvgate/internal/testutil"
)

// A command line built from Options parses back to the same Options.
func TestArgsRoundTrip(t *testing.T) {
	full := Options{
		Listen: "127.0.0.1:1", ExtProc: "127.0.0.1:2", WasmPath: "/f.wasm", WasmConfig: `{"a":1}`,
		WasmVMConfig: "@vm.json", WasmVMs: 3, FailureModeAllow: true, RequestBodyMode: "none",
		ResponseBodyMode: "none", ExtProcTimeout: 30 * time.Second, UpstreamTimeout: 2 * time.Minute,
		Fallback: "127.0.0.1:3,127.0.0.1:4", MaxRequestBuffer: 99,
		BodyBudgetBytes: 1 << 30, MemoryLimit: 3 << 30, BodyIdleTimeout: time.Second, UpstreamIdleTimeout: time.Minute,
		MaxRequestHeaders: 7, MaxRequestHeaderBytes: 8, BlockedPaths: "/a,/b", TrustClientRewrite: true,
		PickerReconnectMax: 3 * time.Second, BodyBasedRouting: true, MetricsAddr: "127.0.0.1:5",
	}
	noFilter := DefaultOptions()
	noFilter.WasmPath, noFilter.ExtProc = "", ""
	cliflagtest.AllSet(t, full)
	parse := func(args []string) (Options, error) { return ParseFlags(args, io.Discard) }
	cliflagtest.RoundTrip(t, parse, Options.Args, DefaultOptions(), full, noFilter)
}

// --memory-limit reaches the runtime: auto is the body budget plus the
// headroom, a size is taken as given, 0 is none, and GOMEMLIMIT wins.
func TestMemoryLimitFlag(t *testing.T) {
	parse := func(args []string) (testutil.ApplyMemoryLimit, error) {
		o, err := ParseFlags(args, io.Discard)
		return o.ApplyMemoryLimit, err
	}
	testutil.MemoryLimitFlag(t, parse, []testutil.MemoryLimitCase{
		{Args: nil, Want: DefaultBodyBudgetBytes + memlimit.Headroom},
		{Args: []string{"--body-budget-bytes", "1073741824"}, Want: 1<<30 + memlimit.Headroom},
		{Args: []string{"--memory-limit", "640MiB"}, Want: 640 << 20},
		{Args: []string{"--memory-limit", "0"}, Want: math.MaxInt64},
		{Args: []string{"--body-budget-bytes", "-1"}, Want: math.MaxInt64},
	}, "much")
}
