package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// recorder is an EventSink that keeps everything.
type recorder struct{ events []Event }

func (r *recorder) Publish(evs []Event) { r.events = append(r.events, evs...) }

func (r *recorder) stored() []*BlockStored {
	var out []*BlockStored
	for _, e := range r.events {
		if s, ok := e.(*BlockStored); ok {
			out = append(out, s)
		}
	}
	return out
}

func (r *recorder) removed() []uint64 {
	var out []uint64
	for _, e := range r.events {
		if s, ok := e.(*BlockRemoved); ok {
			out = append(out, s.BlockHashes...)
		}
	}
	return out
}

// testConfig is a small Llama-8B/H100 engine whose cache the tests size.
func testConfig(clock Clock, sink EventSink) Config {
	p, _ := LookupPreset("llama-3.1-8b-h100")
	return Config{Timing: p.Timing, Clock: clock, Events: sink, HashSeed: "42"}
}

func newTestEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type arrival struct {
	at  time.Duration
	req Request
}

// outcome is what a client of the simulated server would see.
type outcome struct {
	arrived  time.Duration
	ttft     time.Duration
	tokenAt  []time.Duration
	tokens   []int
	finished Finished
}

// simulate replays arrivals against e on clock (started at epoch) the way
// a discrete-event harness does: requests arriving during a step are added
// before the next one; an idle engine jumps to the next arrival or wake-up.
func simulate(t testing.TB, e *Engine, clock *VirtualClock, arrivals []arrival) map[string]*outcome {
	t.Helper()
	out := make(map[string]*outcome, len(arrivals))
	next := 0
	for {
		now := clock.Now()
		for next < len(arrivals) && !epoch.Add(arrivals[next].at).After(now) {
			a := arrivals[next]
			if err := e.Add(a.req); err != nil {
				t.Fatalf("add %s: %v", a.req.ID, err)
			}
			out[a.req.ID] = &outcome{arrived: a.at}
			next++
		}
		if len(e.pool.blocks) <= 2000 {
			checkInvariants(t, e) // O(blocks): only for the small caches of targeted tests
		}
		res := e.Step()
		if res.Idle() {
			var wake time.Time
			if next < len(arrivals) {
				wake = epoch.Add(arrivals[next].at)
			}
			if w, ok := e.NextWake(); ok && (wake.IsZero() || w.Before(wake)) {
				wake = w
			}
			if wake.IsZero() {
				return out
			}
			clock.Set(wake)
			continue
		}
		clock.Advance(res.Duration)
		at := clock.Now().Sub(epoch)
		for _, tok := range res.Tokens {
			o := out[tok.ID]
			if tok.Index == 0 {
				o.ttft = at - o.arrived
			}
			o.tokenAt = append(o.tokenAt, at)
			o.tokens = append(o.tokens, tok.Token)
		}
		for _, f := range res.Finished {
			out[f.ID].finished = f
		}
	}
}

// checkInvariants cross-checks the block pool against the requests.
func checkInvariants(t testing.TB, e *Engine) {
	t.Helper()
	refs := make([]int32, len(e.pool.blocks))
	for _, s := range e.byID {
		for _, b := range s.blocks {
			refs[b]++
		}
		if len(s.blocks) > 0 && s.state == stateWaiting && s.computed == 0 {
			t.Fatalf("%s waits with %d blocks and nothing computed", s.req.ID, len(s.blocks))
		}
	}
	free := 0
	for id := e.pool.head; id != noBlock; id = e.pool.blocks[id].next {
		free++
		if refs[id] != 0 {
			t.Fatalf("block %d is free but referenced %d times", id, refs[id])
		}
	}
	if free != e.pool.numFree {
		t.Fatalf("free queue holds %d blocks, counter says %d", free, e.pool.numFree)
	}
	for id := range e.pool.blocks {
		if got := e.pool.blocks[id].ref; got != refs[id] {
			t.Fatalf("block %d: ref %d, requests hold %d", id, got, refs[id])
		}
	}
	for h, id := range e.pool.cached {
		if b := e.pool.blocks[id]; !b.hashed || b.hash != h {
			t.Fatalf("cache map entry for block %d is stale", id)
		}
	}
	if n := len(e.running); n > e.cfg.MaxNumSeqs {
		t.Fatalf("%d running > MaxNumSeqs %d", n, e.cfg.MaxNumSeqs)
	}
}

// randomPrompt draws n token ids below 100k from r.
func randomPrompt(r *rand.Rand, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = r.IntN(100000)
	}
	return p
}

// poisson draws n arrivals at rate per second.
func poisson(r *rand.Rand, n int, rate float64, mk func(i int) Request) []arrival {
	out := make([]arrival, n)
	at := 0.0
	for i := range out {
		at += r.ExpFloat64() / rate
		out[i] = arrival{at: time.Duration(at * float64(time.Second)), req: mk(i)}
	}
	return out
}

func mean(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(max(1, len(ds)))
}

func ttfts(out map[string]*outcome) []time.Duration {
	ids := make([]string, 0, len(out))
	for id := range out {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ds := make([]time.Duration, len(ids))
	for i, id := range ids {
		ds[i] = out[id].ttft
	}
	return ds
}
