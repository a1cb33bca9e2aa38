package engine

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"
)

func startRunner(t *testing.T, cfg Config) *Runner {
	t.Helper()
	r, err := NewRunner(cfg, 1000)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// drain reads a stream to its end.
func drain(t *testing.T, st *Stream) ([]int, *Finished) {
	t.Helper()
	var all []int
	for {
		toks, fin, err := st.Next(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, toks...)
		if fin != nil {
			return all, fin
		}
	}
}

// lockedRecorder is a recorder for a sink called from Run's goroutine.
type lockedRecorder struct {
	mu  sync.Mutex
	rec recorder
}

func (l *lockedRecorder) Publish(evs []Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rec.Publish(evs)
}

func (l *lockedRecorder) numStored() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.rec.stored())
}

func TestRunnerStreams(t *testing.T) {
	p, _ := LookupPreset("qwen3-0.6b-h100")
	sink := &lockedRecorder{}
	r := startRunner(t, Config{Timing: p.Timing, Events: sink})
	var wg sync.WaitGroup
	for i := range 8 {
		st, err := r.Submit(Request{ID: strconv.Itoa(i), Prompt: make([]int, 100+i), MaxTokens: 20 + i})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			toks, fin := drain(t, st)
			if len(toks) != 20+i || fin.Reason != FinishLength || fin.Usage.CompletionTokens != 20+i {
				t.Errorf("request %d: %d tokens, finished %+v", i, len(toks), fin)
			}
		})
	}
	wg.Wait()
	if m := r.Metrics(); m.GenerationTokens != 8*20+28 || m.Running+m.Waiting != 0 {
		t.Errorf("metrics after the run: %+v", m)
	}
	// All prompts are zeros: the first request stores the shared blocks,
	// the others hit them, and each stores its decode blocks as they fill.
	if sink.numStored() < 8 {
		t.Errorf("sink got %d BlockStored events", sink.numStored())
	}
}

func TestRunnerAbortAndErrors(t *testing.T) {
	p, _ := LookupPreset("qwen3-0.6b-h100")
	r := startRunner(t, Config{Timing: p.Timing, MaxWaiting: 1})
	st, err := r.Submit(Request{ID: "long", Prompt: make([]int, 10), MaxTokens: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Next(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := r.Abort("long"); err != nil {
		t.Fatal(err)
	}
	if _, fin := drain(t, st); fin.Reason != FinishAbort {
		t.Errorf("aborted stream finished with %q", fin.Reason)
	}
	if _, err := r.Submit(Request{ID: "bad", MaxTokens: 1}); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("empty prompt: %v", err)
	}
	if _, err := NewRunner(Config{Timing: p.Timing}, 0); !errors.Is(err, ErrConfig) {
		t.Errorf("zero scale: %v", err)
	}
}

func TestRunnerPrefillOnly(t *testing.T) {
	p, _ := LookupPreset("qwen3-0.6b-h100")
	r := startRunner(t, Config{Timing: p.Timing})
	st, err := r.Submit(Request{ID: "p", Prompt: make([]int, 64), PrefillOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, fin := drain(t, st); fin.Transfer == nil || len(fin.Transfer.BlockIDs) != 4 {
		t.Fatalf("prefill-only finished %+v", fin)
	}
	if err := r.Release("p"); err != nil {
		t.Fatal(err)
	}
	if m := r.Metrics(); m.HeldRequests != 0 || m.KVUsage != 0 {
		t.Errorf("after release: %+v", m)
	}
}

// TestRunnerResetAfterPendingStep: a reset while a finished step's events
// still wait for its duration announces those events first, so that a
// subscriber applying them in order ends up with an empty cache, as the
// engine has.
func TestRunnerResetAfterPendingStep(t *testing.T) {
	p, _ := LookupPreset("qwen3-0.6b-h100")
	sink := &lockedRecorder{}
	r, err := NewRunner(Config{Timing: p.Timing, Events: sink}, 0.005) // steps 200 times slower than modelled
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for attempt := 0; ; attempt++ {
		if attempt == 20 {
			t.Fatal("never reset while a step's events were pending")
		}
		st, err := r.Submit(Request{ID: strconv.Itoa(attempt), Prompt: make([]int, 64), MaxTokens: 1})
		if err != nil {
			t.Fatal(err)
		}
		// The request finishes in its first step; until that step's
		// duration has passed, its events are pending.
		inWindow := false
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			r.mu.Lock()
			pending := r.unsent != nil && len(r.unsent.Finished) > 0 && len(r.unsent.Events) > 0
			r.mu.Unlock()
			if pending {
				inWindow = r.ResetPrefixCache() == nil
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		drain(t, st)
		if !inWindow {
			continue
		}
		sink.mu.Lock()
		evs := sink.rec.events
		sink.mu.Unlock()
		if _, ok := evs[len(evs)-1].(*AllBlocksCleared); !ok {
			t.Fatalf("the last event is %T, not the reset: the reset was announced before the step's events", evs[len(evs)-1])
		}
		return
	}
}
