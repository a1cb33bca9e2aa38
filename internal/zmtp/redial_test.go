package zmtp

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// Redial reports a peer that stays unreachable through its longest
// backoff once, not at every attempt, and again after a connection was
// established and lost.
func TestRedialReportsUnreachableOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The peer refuses every handshake (closing at once) except when
	// serve is set: then it completes one.
	var accepts atomic.Int64
	var serve atomic.Bool
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			if serve.CompareAndSwap(true, false) {
				_, _ = Handshake(nc, HandshakeConfig{Type: PUB}, time.Now().Add(testTimeout))
			}
			_ = nc.Close()
		}
	}()
	reports := make(chan error, 4)
	connected := make(chan struct{}, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Redial(ctx, "tcp://"+ln.Addr().String(), DialConfig{
			HandshakeConfig: HandshakeConfig{Type: SUB}, HandshakeTimeout: testTimeout,
			RedialMin: time.Millisecond, RedialMax: 4 * time.Millisecond,
			Unreachable: func(err error) { reports <- err },
		}, func(context.Context, *Conn) { connected <- struct{}{} })
	}()
	defer func() { cancel(); <-done }()
	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(testTimeout):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	report := func() {
		t.Helper()
		select {
		case err := <-reports:
			if err == nil {
				t.Fatal("reported with no error")
			}
		case <-time.After(testTimeout):
			t.Fatal("an unreachable peer was not reported")
		}
	}
	manyMore := func() {
		t.Helper()
		deadline := time.Now().Add(testTimeout)
		for n := accepts.Load() + 20; accepts.Load() < n; {
			if time.Now().After(deadline) {
				t.Fatal("Redial stopped dialing")
			}
			time.Sleep(time.Millisecond)
		}
	}
	report()
	manyMore()
	if len(reports) != 0 {
		t.Fatal("reported again before any connection")
	}
	serve.Store(true)
	wait("a connection", connected)
	report()
	manyMore()
	if len(reports) != 0 {
		t.Fatal("reported twice after one connection")
	}
}
