package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/internal/testutil"
)

// A --listen address already taken fails Run, which releases the picker
// connection and upstream transport it had built: no goroutine is left.
func TestRunUnwindsWhenListenFails(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	o := gateway.DefaultOptions()
	o.Listen, o.ExtProc, o.WasmPath = taken.Addr().String(), "127.0.0.1:1", ""
	before := runtime.NumGoroutine()
	err = gateway.Run(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), taken.Addr().String()) {
		t.Fatalf("Run = %v, want a listen error for %s", err, taken.Addr())
	}
	testutil.NoGoroutineLeak(t, before, "the failed Run")
}
