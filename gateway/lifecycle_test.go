package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

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

// TestServeStopsRequestsPastTheGrace: a request still in flight when the
// shutdown grace ends (an upstream that never answers) is cut, not left
// running after Serve returned: before, Serve returned the grace's error
// with the connection, its handler and the upstream exchange still open,
// and the caller then closed the Gateway under them.
func TestServeStopsRequestsPastTheGrace(t *testing.T) {
	arrived, upstreamDone, quit := make(chan struct{}), make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		select {
		case <-r.Context().Done():
			close(upstreamDone)
		case <-quit: // the test is over
		}
	}))
	defer up.Close()
	defer close(quit)
	g, err := gateway.New(context.Background(), gateway.Config{Fallback: []string{up.Listener.Addr().String()},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- gateway.Serve(ctx, ln, g) }()
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/v1/models")
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-arrived
	cancel()
	if err := <-served; err == nil {
		t.Fatal("Serve returned no error with a request past the grace")
	}
	select {
	case <-upstreamDone:
	case <-time.After(10 * time.Second): // a hang guard, not a timing assertion
		t.Fatal("the upstream exchange is still open after Serve returned")
	}
}
