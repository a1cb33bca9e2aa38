package engine

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

func TestPrefixHit(t *testing.T) {
	tests := []struct {
		name       string
		promptLen  int
		second     func(p []int) Request
		wantCached int
	}{
		{"same prompt", 1000, func(p []int) Request { return Request{ID: "b", Prompt: p, MaxTokens: 4} }, 992},
		{"exact block multiple leaves the last token to compute", 1024,
			func(p []int) Request { return Request{ID: "b", Prompt: p, MaxTokens: 4} }, 1008},
		{"shared prefix", 1000, func(p []int) Request {
			q := slices.Clone(p)
			q[500] = -1
			return Request{ID: "b", Prompt: q, MaxTokens: 4}
		}, 496},
		{"other salt", 1000, func(p []int) Request {
			return Request{ID: "b", Prompt: p, MaxTokens: 4, CacheSalt: "tenant"}
		}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewVirtualClock(epoch)
			e := newTestEngine(t, testConfig(clock, nil))
			p := randomPrompt(rand.New(rand.NewPCG(1, 2)), tc.promptLen)
			out := simulate(t, e, clock, []arrival{
				{0, Request{ID: "a", Prompt: p, MaxTokens: 4}},
				{time.Second, tc.second(p)},
			})
			a, b := out["a"], out["b"]
			if a.finished.Usage.CachedTokens != 0 {
				t.Errorf("cold request reports %d cached tokens", a.finished.Usage.CachedTokens)
			}
			if got := b.finished.Usage.CachedTokens; got != tc.wantCached {
				t.Errorf("cached tokens = %d, want %d", got, tc.wantCached)
			}
			if tc.wantCached > 0 && b.ttft >= a.ttft {
				t.Errorf("TTFT with %d cached tokens %v, not below cold %v", tc.wantCached, b.ttft, a.ttft)
			}
			m := e.Metrics()
			if m.PrefixCacheQueries != int64(2*tc.promptLen) || m.PrefixCacheHits != int64(tc.wantCached) {
				t.Errorf("prefix stats queries=%d hits=%d", m.PrefixCacheQueries, m.PrefixCacheHits)
			}
		})
	}
}

// TestEvictionLRU fills a tiny cache so that a new request must evict: the
// blocks freed longest ago go first, and a request's tail before its head.
func TestEvictionLRU(t *testing.T) {
	clock := NewVirtualClock(epoch)
	rec := &recorder{}
	cfg := testConfig(clock, rec)
	cfg.BlockSize, cfg.NumGPUBlocks = 4, 8
	e := newTestEngine(t, cfg)
	r := rand.New(rand.NewPCG(3, 4))
	pa, pb, pc := randomPrompt(r, 8), randomPrompt(r, 8), randomPrompt(r, 24)
	simulate(t, e, clock, []arrival{
		{0, Request{ID: "a", Prompt: pa, MaxTokens: 1}},
		{time.Second, Request{ID: "b", Prompt: pb, MaxTokens: 1}},
		{2 * time.Second, Request{ID: "c", Prompt: pc, MaxTokens: 1}},
	})
	st := rec.stored()
	if len(st) != 3 {
		t.Fatalf("%d BlockStored events, want 3", len(st))
	}
	aHashes := st[0].BlockHashes
	want := []uint64{aHashes[1], aHashes[0]}
	if got := rec.removed(); !reflect.DeepEqual(got, want) {
		t.Fatalf("removed %v, want a's blocks tail first %v", got, want)
	}

	// b survived the eviction and is still a hit; a is gone.
	out := simulate(t, e, clock, []arrival{
		{3 * time.Second, Request{ID: "b2", Prompt: append(slices.Clone(pb), 7), MaxTokens: 1}},
		{4 * time.Second, Request{ID: "a2", Prompt: append(slices.Clone(pa), 7), MaxTokens: 1}},
	})
	if got := out["b2"].finished.Usage.CachedTokens; got != 8 {
		t.Errorf("b2 cached %d tokens, want 8", got)
	}
	if got := out["a2"].finished.Usage.CachedTokens; got != 0 {
		t.Errorf("a2 cached %d tokens of an evicted prefix", got)
	}
}

// TestPreemption runs more decoding than the cache holds: requests are
// preempted, recompute, and still produce exactly the tokens they would
// have produced without pressure.
func TestPreemption(t *testing.T) {
	run := func(blocks int) (map[string]*outcome, Metrics) {
		clock := NewVirtualClock(epoch)
		cfg := testConfig(clock, nil)
		cfg.NumGPUBlocks = blocks
		e := newTestEngine(t, cfg)
		r := rand.New(rand.NewPCG(5, 6))
		var arr []arrival
		for i := range 6 {
			arr = append(arr, arrival{0, Request{ID: string(rune('a' + i)), Prompt: randomPrompt(r, 100), MaxTokens: 200}})
		}
		return simulate(t, e, clock, arr), e.Metrics()
	}
	roomy, mr := run(1000)
	tight, mt := run(60) // 6 × 19 blocks would be needed at the end
	if mr.Preemptions != 0 {
		t.Fatalf("%d preemptions with a roomy cache", mr.Preemptions)
	}
	if mt.Preemptions == 0 {
		t.Fatal("no preemption under block pressure")
	}
	for id, o := range tight {
		if len(o.tokens) != 200 || !slices.Equal(o.tokens, roomy[id].tokens) {
			t.Errorf("%s: output changed by preemption", id)
		}
	}
	if mt.KVUsage != 0 || mt.Running != 0 || mt.Waiting != 0 {
		t.Errorf("engine not drained: %+v", mt)
	}
}

func TestChunkedPrefillBudget(t *testing.T) {
	clock := NewVirtualClock(epoch)
	cfg := testConfig(clock, nil)
	cfg.MaxNumBatchedTokens = 64
	e := newTestEngine(t, cfg)
	r := rand.New(rand.NewPCG(7, 8))
	if err := e.Add(Request{ID: "d", Prompt: randomPrompt(r, 10), MaxTokens: 50}); err != nil {
		t.Fatal(err)
	}
	e.Step() // d's prefill; it decodes from now on
	if err := e.Add(Request{ID: "p", Prompt: randomPrompt(r, 200), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	var chunks []int
	for range 4 {
		res := e.Step()
		if res.Shape.DecodeSeqs != 1 {
			t.Fatalf("decode not scheduled first: %+v", res.Shape)
		}
		if n := res.Shape.PrefillTokens + res.Shape.DecodeSeqs; n > 64 {
			t.Fatalf("step scheduled %d tokens > budget 64", n)
		}
		chunks = append(chunks, res.Shape.PrefillTokens)
	}
	if want := []int{63, 63, 63, 11}; !slices.Equal(chunks, want) {
		t.Errorf("prefill chunks %v, want %v", chunks, want)
	}
}

func TestLoRALimit(t *testing.T) {
	clock := NewVirtualClock(epoch)
	cfg := testConfig(clock, nil)
	cfg.MaxLoRAs = 1
	e := newTestEngine(t, cfg)
	r := rand.New(rand.NewPCG(9, 10))
	for _, req := range []Request{
		{ID: "a", LoRA: "alice", Prompt: randomPrompt(r, 50), MaxTokens: 20},
		{ID: "b", LoRA: "bob", Prompt: randomPrompt(r, 50), MaxTokens: 20},
		{ID: "base", Prompt: randomPrompt(r, 50), MaxTokens: 20},
		{ID: "a2", LoRA: "alice", Prompt: randomPrompt(r, 50), MaxTokens: 20},
	} {
		if err := e.Add(req); err != nil {
			t.Fatal(err)
		}
	}
	e.Step()
	m := e.Metrics()
	if !slices.Equal(m.RunningLoRAs, []string{"alice"}) || !slices.Equal(m.WaitingLoRAs, []string{"bob"}) {
		t.Fatalf("running %v waiting %v, want [alice] [bob]", m.RunningLoRAs, m.WaitingLoRAs)
	}
	if m.Running != 3 || m.MaxLoRAs != 1 {
		t.Fatalf("running %d (want a, base, a2), max loras %d", m.Running, m.MaxLoRAs)
	}
	for e.Metrics().Waiting > 0 {
		if e.Step().Idle() {
			t.Fatal("bob never scheduled")
		}
	}
	if m := e.Metrics(); !slices.Equal(m.RunningLoRAs, []string{"bob"}) {
		t.Errorf("running adapters %v after alice finished, want [bob]", m.RunningLoRAs)
	}
}

func TestAddErrors(t *testing.T) {
	clock := NewVirtualClock(epoch)
	cfg := testConfig(clock, nil)
	cfg.MaxWaiting = 2
	cfg.MaxModelLen = 100
	e := newTestEngine(t, cfg)
	ok := Request{ID: "ok", Prompt: []int{1, 2, 3}, MaxTokens: 1}
	if err := e.Add(ok); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  Request
		want error
	}{
		{"no id", Request{Prompt: []int{1}, MaxTokens: 1}, ErrInvalidRequest},
		{"empty prompt", Request{ID: "x", MaxTokens: 1}, ErrInvalidRequest},
		{"zero max tokens", Request{ID: "x", Prompt: []int{1}}, ErrInvalidRequest},
		{"too long", Request{ID: "x", Prompt: make([]int, 90), MaxTokens: 11}, ErrTooLong},
		{"duplicate", ok, ErrDuplicateID},
		{"lora disabled", Request{ID: "x", Prompt: []int{1}, MaxTokens: 1, LoRA: "l"}, ErrLoRADisabled},
		{"both P/D roles", Request{ID: "x", Prompt: []int{1}, PrefillOnly: true, RemotePrefill: &RemotePrefill{}}, ErrInvalidRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := e.Add(tc.req); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	if err := e.Add(Request{ID: "2", Prompt: []int{1}, MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.Add(Request{ID: "3", Prompt: []int{1}, MaxTokens: 1}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("third request: %v, want ErrQueueFull", err)
	}
}

// TestTTFTGrowsWithLoad drives one replica below and above its capacity.
func TestTTFTGrowsWithLoad(t *testing.T) {
	var prev time.Duration
	for _, rate := range []float64{1, 10, 40} {
		clock := NewVirtualClock(epoch)
		cfg := testConfig(clock, nil)
		cfg.MaxWaiting = 10000
		e := newTestEngine(t, cfg)
		r := rand.New(rand.NewPCG(11, 12))
		arr := poisson(r, 300, rate, func(i int) Request {
			return Request{ID: string(rune(i)), Prompt: randomPrompt(r, 2000), MaxTokens: 100}
		})
		got := mean(ttfts(simulate(t, e, clock, arr)))
		t.Logf("%4.0f req/s: mean TTFT %v", rate, got)
		if got <= prev {
			t.Errorf("mean TTFT at %v req/s is %v, not above %v", rate, got, prev)
		}
		prev = got
	}
}

func TestDeterminism(t *testing.T) {
	run := func() (map[string]*outcome, []Event) {
		clock := NewVirtualClock(epoch)
		rec := &recorder{}
		cfg := testConfig(clock, rec)
		cfg.NumGPUBlocks, cfg.MaxLoRAs = 300, 2
		e := newTestEngine(t, cfg)
		r := rand.New(rand.NewPCG(13, 14))
		shared := randomPrompt(r, 512)
		arr := poisson(r, 200, 20, func(i int) Request {
			p := append(slices.Clone(shared[:r.IntN(512)]), randomPrompt(r, 1+r.IntN(300))...)
			lora := []string{"", "x", "y", "z"}[r.IntN(4)]
			return Request{ID: string(rune(i)), Prompt: p, MaxTokens: 1 + r.IntN(100), LoRA: lora}
		})
		return simulate(t, e, clock, arr), rec.events
	}
	o1, ev1 := run()
	o2, ev2 := run()
	if !reflect.DeepEqual(o1, o2) || !reflect.DeepEqual(ev1, ev2) {
		t.Fatal("two runs of the same trace differ")
	}
}

// TestVectorThroughEngine feeds the vLLM test vector's token ids through a
// Qwen3-0.6B engine and expects the BlockStored event real vLLM emitted.
func TestVectorThroughEngine(t *testing.T) {
	v := testutil.LoadHashVector(t)
	clock := NewVirtualClock(epoch)
	rec := &recorder{}
	p, _ := LookupPreset("qwen3-0.6b-h100")
	e := newTestEngine(t, Config{Timing: p.Timing, Clock: clock, Events: rec, HashSeed: v.Seed, BlockSize: v.BlockSize})
	simulate(t, e, clock, []arrival{{0, Request{ID: "v", Prompt: v.TokenIDs, MaxTokens: 1}}})
	st := rec.stored()
	if len(st) != 1 {
		t.Fatalf("%d BlockStored events, want 1", len(st))
	}
	ev := st[0]
	if !slices.Equal(ev.BlockHashes, v.BlockHashes) {
		t.Errorf("hashes differ from vLLM's:\n got %v\nwant %v", ev.BlockHashes, v.BlockHashes)
	}
	if ev.HasParent || ev.Medium != v.Medium || ev.BlockSize != v.BlockSize || !slices.Equal(ev.TokenIDs, v.TokenIDs) {
		t.Errorf("event fields: parent=%v medium=%q block size=%d", ev.HasParent, ev.Medium, ev.BlockSize)
	}
}

func TestPrefillOnlyHoldsBlocks(t *testing.T) {
	tests := []struct {
		name    string
		release bool
	}{{"released", true}, {"timed out", false}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewVirtualClock(epoch)
			e := newTestEngine(t, testConfig(clock, nil))
			if err := e.Add(Request{ID: "p", Prompt: make([]int, 100), PrefillOnly: true}); err != nil {
				t.Fatal(err)
			}
			res := e.Step()
			if len(res.Finished) != 1 {
				t.Fatalf("prefill did not finish in one step: %+v", res)
			}
			f := res.Finished[0]
			clock.Advance(res.Duration)
			if f.Transfer == nil || len(f.Transfer.BlockIDs) != 7 || f.Usage.CompletionTokens != 1 {
				t.Fatalf("finished %+v", f)
			}
			if m := e.Metrics(); m.HeldRequests != 1 || m.KVUsage == 0 {
				t.Fatalf("blocks not held: %+v", m)
			}
			if tc.release {
				if err := e.Release("p"); err != nil {
					t.Fatal(err)
				}
			} else {
				w, ok := e.NextWake()
				if !ok || w.Sub(clock.Now()) > e.Config().HeldBlockTimeout {
					t.Fatalf("NextWake %v %v", w, ok)
				}
				clock.Set(w)
				e.Step()
			}
			if m := e.Metrics(); m.HeldRequests != 0 || m.KVUsage != 0 {
				t.Fatalf("blocks still held: %+v", m)
			}
			if err := e.Release("p"); !errors.Is(err, ErrUnknownRequest) {
				t.Errorf("second release: %v", err)
			}
		})
	}
}

func TestRemotePrefill(t *testing.T) {
	clock := NewVirtualClock(epoch)
	rec := &recorder{}
	e := newTestEngine(t, testConfig(clock, rec))
	prompt := randomPrompt(rand.New(rand.NewPCG(15, 16)), 1000)
	if err := e.Add(Request{ID: "d", Prompt: prompt, MaxTokens: 3, RemotePrefill: &RemotePrefill{Tokens: 999}}); err != nil {
		t.Fatal(err)
	}
	if res := e.Step(); !res.Idle() {
		t.Fatalf("computed %+v before the KV arrived", res.Shape)
	}
	if m := e.Metrics(); m.Waiting != 1 || m.KVUsage == 0 {
		t.Fatalf("transfer holds no blocks: %+v", m)
	}
	if len(rec.stored()) != 0 {
		t.Fatal("blocks announced before they landed")
	}
	w, ok := e.NextWake()
	if !ok {
		t.Fatal("no wake-up for the transfer")
	}
	// 999 tokens × 128 KiB at 12 GB/s + 1 ms.
	if got, want := w.Sub(epoch), time.Millisecond+time.Duration(999*131072/12e9*1e9); got != want {
		t.Errorf("transfer takes %v, want %v", got, want)
	}
	clock.Set(w)
	res := e.Step()
	if res.Shape.PrefillTokens != 1 || len(res.Tokens) != 1 {
		t.Fatalf("after the transfer: %+v", res.Shape)
	}
	if st := rec.stored(); len(st) != 1 || len(st[0].BlockHashes) != 62 {
		t.Fatalf("landing announced %d events", len(st))
	}
	for !e.Step().Idle() {
	}
	if m := e.Metrics(); m.GenerationTokens != 3 || m.PrefixCacheHits != 0 {
		t.Errorf("metrics %+v", m)
	}
}

// A pull's own path (the prefiller's) times it instead of the engine's.
func TestRemotePrefillPath(t *testing.T) {
	clock := NewVirtualClock(epoch)
	e := newTestEngine(t, testConfig(clock, &recorder{}))
	prompt := randomPrompt(rand.New(rand.NewPCG(17, 18)), 1000)
	rp := &RemotePrefill{Tokens: 999, Bandwidth: 1e9, Latency: 5 * time.Millisecond}
	if err := e.Add(Request{ID: "d", Prompt: prompt, MaxTokens: 2, RemotePrefill: rp}); err != nil {
		t.Fatal(err)
	}
	e.Step()
	w, ok := e.NextWake()
	if want := 5*time.Millisecond + time.Duration(999*131072/1e9*1e9); !ok || w.Sub(epoch) != want {
		t.Errorf("transfer takes %v, want %v", w.Sub(epoch), want)
	}
}

func TestAbortFreesBlocks(t *testing.T) {
	clock := NewVirtualClock(epoch)
	e := newTestEngine(t, testConfig(clock, nil))
	for _, id := range []string{"run", "wait"} {
		if err := e.Add(Request{ID: id, Prompt: make([]int, 100), MaxTokens: 10}); err != nil {
			t.Fatal(err)
		}
		if id == "run" {
			e.Step()
		}
	}
	for _, id := range []string{"run", "wait"} {
		if err := e.Abort(id); err != nil {
			t.Fatal(err)
		}
	}
	checkInvariants(t, e)
	if m := e.Metrics(); m.Running+m.Waiting != 0 || m.KVUsage != 0 {
		t.Errorf("after aborts: %+v", m)
	}
	if err := e.Abort("run"); !errors.Is(err, ErrUnknownRequest) {
		t.Errorf("second abort: %v", err)
	}
}

func TestResetPrefixCache(t *testing.T) {
	clock := NewVirtualClock(epoch)
	rec := &recorder{}
	e := newTestEngine(t, testConfig(clock, rec))
	p := make([]int, 64)
	if err := e.Add(Request{ID: "a", Prompt: p, MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	e.Step()
	if err := e.ResetPrefixCache(); !errors.Is(err, ErrCacheInUse) {
		t.Fatalf("reset while running: %v", err)
	}
	for !e.Step().Idle() {
	}
	if err := e.ResetPrefixCache(); err != nil {
		t.Fatal(err)
	}
	if _, ok := rec.events[len(rec.events)-1].(*AllBlocksCleared); !ok {
		t.Error("no AllBlocksCleared event")
	}
	out := simulate(t, e, clock, []arrival{{0, Request{ID: "b", Prompt: p, MaxTokens: 1}}})
	if got := out["b"].finished.Usage.CachedTokens; got != 0 {
		t.Errorf("%d tokens hit a cleared cache", got)
	}
}

// TestWakeForTransferThatLandedUnseen: when a transfer lands between a
// Step and the caller's NextWake (a real clock moves on in between), the
// engine must still ask for a Step, or the request is never scheduled.
func TestWakeForTransferThatLandedUnseen(t *testing.T) {
	clock := NewVirtualClock(epoch)
	e := newTestEngine(t, testConfig(clock, nil))
	prompt := randomPrompt(rand.New(rand.NewPCG(17, 18)), 100)
	if err := e.Add(Request{ID: "d", Prompt: prompt, MaxTokens: 2, RemotePrefill: &RemotePrefill{Tokens: 99}}); err != nil {
		t.Fatal(err)
	}
	e.Step() // the pull starts
	landed, ok := e.NextWake()
	if !ok {
		t.Fatal("no wake-up for the transfer")
	}
	clock.Set(landed.Add(time.Millisecond)) // it lands before anyone looks
	w, ok := e.NextWake()
	if !ok || w.After(clock.Now()) {
		t.Fatalf("NextWake = %v, %v after the transfer landed unseen; want now", w, ok)
	}
	if res := e.Step(); res.Shape.PrefillTokens == 0 {
		t.Fatalf("the landed request was not scheduled: %+v", res.Shape)
	}
	// Taken in: no wake-up is owed for it any more.
	for !e.Step().Idle() {
	}
	if w, ok := e.NextWake(); ok {
		t.Fatalf("NextWake = %v after the request finished", w)
	}
}
