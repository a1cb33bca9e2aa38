package gateway

import (
	"io"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/cliflag/cliflagtest"
)

// A command line built from Options parses back to the same Options.
func TestArgsRoundTrip(t *testing.T) {
	full := Options{
		Listen: "127.0.0.1:1", ExtProc: "127.0.0.1:2", WasmPath: "/f.wasm", WasmConfig: `{"a":1}`,
		WasmVMConfig: "@vm.json", WasmVMs: 3, FailureModeAllow: true, RequestBodyMode: "none",
		ResponseBodyMode: "none", ExtProcTimeout: 30 * time.Second, UpstreamTimeout: 2 * time.Minute,
		Fallback: "127.0.0.1:3,127.0.0.1:4", MaxRequestBuffer: 99,
		BodyBudgetBytes: 1 << 30, BodyIdleTimeout: time.Second, UpstreamIdleTimeout: time.Minute,
		MaxRequestHeaders: 7, MaxRequestHeaderBytes: 8, BlockedPaths: "/a,/b", TrustClientRewrite: true,
		PickerReconnectMax: 3 * time.Second,
	}
	noFilter := DefaultOptions()
	noFilter.WasmPath, noFilter.ExtProc = "", ""
	cliflagtest.AllSet(t, full)
	parse := func(args []string) (Options, error) { return ParseFlags(args, io.Discard) }
	cliflagtest.RoundTrip(t, parse, Options.Args, DefaultOptions(), full, noFilter)
}
