package demo

import (
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/epp"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/sim/vllmserver"
)

// Each child's command line is built from its own Options type and parses
// back, with the child's own flags, to those options.
func TestChildCommandLinesParseBack(t *testing.T) {
	c := StackConfig{TokenizerDir: "/tok", Wasm: "/f.wasm", Replicas: 2, Policy: PolicyRoundRobin,
		TimeScale: 0.03, NumGPUBlocks: 600, HashSeed: "42", FailOpen: true}
	ports := fleetPorts{kvEvents: 1, grpc: 2, health: 3, metrics: 4, gateway: 5, sims: []int{6, 7}}

	for i := range c.Replicas {
		want := c.simOptions(i, ports)
		got, err := vllmserver.ParseFlags(want.Args(), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		got.Logger, want.Logger = nil, nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("sim %d: %q parses to\n%+v, want\n%+v", i, want.Args(), got, want)
		}
		if got.Port != ports.sims[i] || got.Seed != uint64(i+1) || got.KVEventsEndpoint != "tcp://127.0.0.1:1" || got.TimeScale != 0.03 {
			t.Fatalf("sim %d options %+v", i, got)
		}
	}

	wantEPP := c.eppOptions("/eps.yaml", "kind: x", ports)
	gotEPP, err := epp.ParseFlags(wantEPP.Args(), io.Discard)
	if err != nil || !reflect.DeepEqual(gotEPP, wantEPP) {
		t.Fatalf("epp: %q parses to %+v, %v; want %+v", wantEPP.Args(), gotEPP, err, wantEPP)
	}
	if gotEPP.DrainTimeout != 2*time.Second || gotEPP.RefreshMetricsInterval != 50*time.Millisecond {
		t.Fatalf("epp options %+v", gotEPP)
	}

	wantGW := c.gatewayOptions(ports)
	gotGW, err := gateway.ParseFlags(wantGW.Args(), io.Discard)
	if err != nil || !reflect.DeepEqual(gotGW, wantGW) {
		t.Fatalf("gateway: %q parses to %+v, %v; want %+v", wantGW.Args(), gotGW, err, wantGW)
	}
	if gotGW.RequestBodyMode != "none" || !gotGW.FailureModeAllow || gotGW.Fallback != "127.0.0.1:6,127.0.0.1:7" {
		t.Fatalf("gateway options %+v", gotGW)
	}
}

func TestParsePDShape(t *testing.T) {
	for in, want := range map[string]PDShape{"1P2D": {Prefill: 1, Decode: 2}, "3p1d": {Prefill: 3, Decode: 1}, " 2P4D ": {Prefill: 2, Decode: 4}} {
		if got, err := ParsePDShape(in); err != nil || got != want || got.String() != strings.ToUpper(strings.TrimSpace(in)) {
			t.Errorf("ParsePDShape(%q) = %+v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "P2D", "1P", "1D2P", "0P1D", "1P0D", "20P20D", "1E1P1D"} {
		if _, err := ParsePDShape(bad); err == nil {
			t.Errorf("ParsePDShape(%q): no error", bad)
		}
	}
}
