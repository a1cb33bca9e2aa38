package gateway

import (
	"io"
	"math"
	"runtime/debug"
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
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{nil, DefaultBodyBudgetBytes + memlimit.Headroom},
		{[]string{"--body-budget-bytes", "1073741824"}, 1<<30 + memlimit.Headroom},
		{[]string{"--memory-limit", "640MiB"}, 640 << 20},
		{[]string{"--memory-limit", "0"}, math.MaxInt64},
		{[]string{"--body-budget-bytes", "-1"}, math.MaxInt64},
	} {
		o, err := ParseFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got, _ := o.ApplyMemoryLimit(noEnv); got != tc.want {
			t.Errorf("%v: ApplyMemoryLimit = %d, want %d", tc.args, got, tc.want)
		}
		if got := debug.SetMemoryLimit(-1); got != tc.want {
			t.Errorf("%v: runtime limit %d, want %d", tc.args, got, tc.want)
		}
	}
	o, err := ParseFlags([]string{"--memory-limit", "1GiB"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	testutil.MemoryLimitEnvWins(t, o.ApplyMemoryLimit)
	if _, err := ParseFlags([]string{"--memory-limit", "much"}, io.Discard); err == nil {
		t.Error("--memory-limit much accepted")
	}
}
