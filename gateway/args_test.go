package gateway

import (
	"io"
	"reflect"
	"testing"
	"time"
)

// A command line built from Options parses back to the same Options.
func TestArgsRoundTrip(t *testing.T) {
	full := Options{
		Listen: "127.0.0.1:1", ExtProc: "127.0.0.1:2", WasmPath: "/f.wasm", WasmConfig: `{"a":1}`,
		WasmVMConfig: "@vm.json", WasmVMs: 3, FailureModeAllow: true, RequestBodyMode: "none",
		ResponseBodyMode: "none", ExtProcTimeout: 30 * time.Second, UpstreamTimeout: 2 * time.Minute,
		Fallback: []string{"127.0.0.1:3", "127.0.0.1:4"}, MaxRequestBuffer: 99,
	}
	noFilter := DefaultOptions()
	noFilter.WasmPath, noFilter.ExtProc = "", ""
	for _, o := range []Options{DefaultOptions(), full, noFilter} {
		got, err := ParseFlags(o.Args(), io.Discard)
		if err != nil {
			t.Fatalf("ParseFlags(%q): %v", o.Args(), err)
		}
		if !reflect.DeepEqual(got, o) {
			t.Fatalf("ParseFlags(%q) =\n%+v, want\n%+v", o.Args(), got, o)
		}
	}
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Errorf("field %s not set in the round-trip options", v.Type().Field(i).Name)
		}
	}
}
