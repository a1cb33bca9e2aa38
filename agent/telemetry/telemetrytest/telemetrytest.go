// Package telemetrytest serves an agent's telemetry service on loopback
// for the tests of its consumers (the picker's store, the picker).
package telemetrytest

import (
	"net"
	"testing"

	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/agent/telemetry"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// Serve starts a telemetry server for cfg on 127.0.0.1 and returns its
// address and a stop function (also run at cleanup; stopping twice is
// fine).
func Serve(tb testing.TB, cfg telemetry.Config) (addr string, stop func()) {
	tb.Helper()
	s, err := telemetry.NewServer(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	g := grpc.NewServer()
	telemetryv1.RegisterTelemetryServer(g, s)
	go g.Serve(ln)
	tb.Cleanup(g.Stop)
	return ln.Addr().String(), g.Stop
}
