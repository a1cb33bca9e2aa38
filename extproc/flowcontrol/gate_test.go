package flowcontrol_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/plugins/flowpolicy"
	"github.com/kvgate/kvgate/internal/testutil"
)

func newGate(t *testing.T, mutate func(*flowcontrol.Config)) (*flowcontrol.Gate, *level, func()) {
	t.Helper()
	p, sat := &pool{}, &level{}
	p.set(1)
	band := flowcontrol.BandConfig{
		Fairness: plugin[flowcontrol.FairnessPolicy](t, flowpolicy.NewGlobalStrict, ""),
		Ordering: plugin[flowcontrol.OrderingPolicy](t, flowpolicy.NewFCFS, ""),
	}
	cfg := flowcontrol.Config{RequestTTL: time.Minute, NoEndpointTTL: time.Minute, DefaultBand: band, DefaultNegativeBand: band,
		UsageLimit: plugin[flowcontrol.UsageLimitPolicy](t, flowpolicy.NewStaticLimit, ""), Detector: sat}
	if mutate != nil {
		mutate(&cfg)
	}
	g, err := flowcontrol.NewGate(cfg, flowcontrol.Options{Pool: p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = g.Run(ctx); close(done) }()
	return g, sat, func() { cancel(); <-done }
}

func waitQueued(t *testing.T, g *flowcontrol.Gate, n int) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("queue length %d", n), func() bool { return g.Controller().Len() == n })
}

func TestGateHoldsWhileSaturatedAndDispatchesOnRelease(t *testing.T) {
	g, sat, stop := newGate(t, nil)
	defer stop()
	// Below saturation: dispatched at once, on the dispatcher.
	var ran atomic.Int32
	if err := g.Admit(context.Background(), flowcontrol.Request{ID: "a", FairnessID: "f"}, func(*flowcontrol.Item) { ran.Add(1) }); err != nil || ran.Load() != 1 {
		t.Fatalf("admit: %v, dispatched %d", err, ran.Load())
	}
	sat.set(1)
	var wg sync.WaitGroup
	var order []string
	var mu sync.Mutex
	for i, r := range []struct {
		id   string
		prio int
	}{{"lo", -1}, {"hi", 5}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := g.Admit(context.Background(), flowcontrol.Request{ID: r.id, FairnessID: "f", Priority: r.prio}, func(it *flowcontrol.Item) {
				mu.Lock()
				order = append(order, it.Request().ID)
				mu.Unlock()
			})
			if err != nil {
				t.Error(err)
			}
		}()
		waitQueued(t, g, i+1)
	}
	sat.set(0)
	g.Notify() // what a release of live load does
	wg.Wait()
	if len(order) != 2 || order[0] != "hi" {
		t.Errorf("dispatch order %v, want hi first", order)
	}
}

func TestGateCancelRemovesAtOnce(t *testing.T) {
	g, sat, stop := newGate(t, nil)
	defer stop()
	sat.set(1)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- g.Admit(ctx, flowcontrol.Request{ID: "x", FairnessID: "f"}, func(*flowcontrol.Item) { t.Error("dispatched a cancelled request") })
	}()
	waitQueued(t, g, 1)
	cancel()
	err := <-errc
	var fe *flowcontrol.Error
	if !errors.As(err, &fe) || fe.Outcome != flowcontrol.EvictedContextCancelled {
		t.Fatalf("err %v", err)
	}
	if n := g.Controller().Len(); n != 0 {
		t.Errorf("queue holds %d after cancel", n)
	}
}

// Shutdown refuses what is queued at once, as shutting down, even when
// capacity frees meanwhile (it does not wait for the queue: the drain is
// the in-flight requests'), leaves a dispatched request alone, and refuses
// what comes after it.
func TestGateShutdown(t *testing.T) {
	g, sat, stop := newGate(t, nil)
	defer stop()
	if err := g.Admit(context.Background(), flowcontrol.Request{ID: "running", FairnessID: "f"}, func(*flowcontrol.Item) {}); err != nil {
		t.Fatal(err)
	}
	sat.set(1)
	errc := make(chan error, 1)
	go func() {
		errc <- g.Admit(context.Background(), flowcontrol.Request{ID: "q", FairnessID: "f"}, func(*flowcontrol.Item) {})
	}()
	waitQueued(t, g, 1)
	g.Shutdown()
	sat.set(0)
	g.Notify()
	var fe *flowcontrol.Error
	if err := <-errc; !errors.As(err, &fe) || !fe.ShuttingDown || fe.Outcome != flowcontrol.EvictedOther {
		t.Fatalf("queued request: %v, want evicted as shutting down", err)
	}
	if n := g.Controller().Len(); n != 0 {
		t.Errorf("queue holds %d after Shutdown", n)
	}
	if err := g.Admit(context.Background(), flowcontrol.Request{ID: "late", FairnessID: "f"}, func(*flowcontrol.Item) {}); !errors.As(err, &fe) || !fe.ShuttingDown {
		t.Errorf("admit after shutdown: %v", err)
	}
}

func TestGateTTLWithoutWake(t *testing.T) {
	g, sat, stop := newGate(t, func(c *flowcontrol.Config) { c.RequestTTL = 20 * time.Millisecond })
	defer stop()
	sat.set(1)
	err := g.Admit(context.Background(), flowcontrol.Request{ID: "t", FairnessID: "f"}, func(*flowcontrol.Item) {})
	var fe *flowcontrol.Error
	if !errors.As(err, &fe) || fe.Outcome != flowcontrol.EvictedTTL {
		t.Fatalf("err %v, want EvictedTTL", err)
	}
}
