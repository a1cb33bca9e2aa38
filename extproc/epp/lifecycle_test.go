package epp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testutil"
)

// requireClosed fails t unless the picker closed ln. It asks the listener
// rather than binding its address again: a freed port may already be
// another process's.
func requireClosed(t *testing.T, ln net.Listener, what string) {
	t.Helper()
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		t.Fatalf("%s: %T, not a TCP listener", what, ln)
	}
	// An open listener times out at once instead of blocking.
	_ = tl.SetDeadline(time.Now())
	if _, err := tl.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("%s %s still open: Accept = %v", what, ln.Addr(), err)
	}
}

func staticOptions(t *testing.T) Options {
	t.Helper()
	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(file, []byte("endpoints: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.EndpointsFile = file
	o.GRPCAddr, o.HealthAddr, o.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.KVEventsAddr = "tcp://127.0.0.1:0"
	return o
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// New starts nothing: building a picker and dropping it leaves no
// goroutine and no socket.
func TestNewStartsNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	p, err := New(staticOptions(t), quiet)
	if err != nil {
		t.Fatal(err)
	}
	testutil.NoGoroutineLeak(t, before, "New")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// A listener that cannot be bound fails Run, which unwinds what it had
// started: the KV-event subscriber's goroutines and socket, and the
// listeners bound before the failing one.
func TestRunUnwindsWhenAPortIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	// The picker binds a health port before failing on the metrics port:
	// the unwind must close it again.
	o := staticOptions(t)
	o.HealthAddr, o.MetricsAddr = "127.0.0.1:0", taken.Addr().String()
	before := runtime.NumGoroutine()
	p, err := New(o, quiet)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), taken.Addr().String()) {
		t.Fatalf("Run = %v, want a listen error for %s", err, taken.Addr())
	}
	testutil.NoGoroutineLeak(t, before, "the failed Run")
	requireClosed(t, p.listeners.health, "health listener")
	select {
	case <-p.Listening():
		t.Fatal("Listening closed although Run failed to bind")
	default:
	}
}

// A KV-event socket that cannot be bound fails Run before any listener.
func TestRunUnwindsWhenKVEventsBindFails(t *testing.T) {
	o := staticOptions(t)
	o.KVEventsAddr = "tcp://256.0.0.1:1"
	before := runtime.NumGoroutine()
	p, err := New(o, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "--kv-events-addr") {
		t.Fatalf("Run = %v, want a --kv-events-addr error", err)
	}
	testutil.NoGoroutineLeak(t, before, "the failed Run")
}

// A registration error is New's error, not a panic.
func TestRegistrationErrorIsReturned(t *testing.T) {
	reg := &checkedRegisterer{Registerer: prometheus.NewRegistry()}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "twice_total", Help: "h"})
	reg.MustRegister(c)
	if reg.err != nil {
		t.Fatal(reg.err)
	}
	reg.MustRegister(c)
	if reg.err == nil {
		t.Fatal("a duplicate registration went unreported")
	}
}

// A picker that ran and was stopped leaves nothing behind either.
func TestRunStopsEverything(t *testing.T) {
	before := runtime.NumGoroutine()
	p, err := New(staticOptions(t), quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-p.Listening():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.NoGoroutineLeak(t, before, "Run returned")
	requireClosed(t, p.listeners.grpc, "ext_proc listener")
}
