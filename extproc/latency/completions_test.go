package latency

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// TestOutputMean: the mean output length averages the first completions
// exactly and then follows new ones; retire is its inverse, none before a
// completion.
func TestOutputMean(t *testing.T) {
	var o outputMean
	if o.retire() != 0 {
		t.Fatal("a batch retires before any completion was seen")
	}
	for _, n := range []float64{100, 200, 300} {
		o.observe(n)
	}
	if o.mean != 200 || math.Abs(o.retire()-1.0/200) > 1e-15 {
		t.Fatalf("mean %v, retire %v; want 200, 1/200", o.mean, o.retire())
	}
	for range 2000 {
		o.observe(50)
	}
	if math.Abs(o.mean-50) > 0.01 {
		t.Fatalf("mean %v after a long run of 50-token outputs", o.mean)
	}
}

// TestFullBatchWaitsForCompletions: on a server running maxRunning
// sequences a prompt is admitted only as they finish. Before any
// completion is seen the twin cannot say when (the feature model
// predicts); once the mean output length is learned it projects the wait,
// longer for longer outputs and behind more waiting prompts, and as before
// where the batch has room.
func TestFullBatchWaitsForCompletions(t *testing.T) {
	const addr = "10.0.0.1:8000"
	now := time.Unix(1_700_000_000, 0)
	full := Engine{Decodes: maxRunning, DecodeTokens: maxRunning * 1000}
	f := Features{Prefill: 100}
	steps := func(output, queued int, eng Engine) (float64, bool) {
		m := New(Config{})
		if output > 0 {
			m.ObserveOutput(addr, output, 1, 0)
		}
		for range queued {
			m.Routed(addr, now, 0, 100, 0)
		}
		s := m.Sample(addr, f, now, eng)
		return s.twin.x[0], s.twin.ok
	}
	if _, ok := steps(0, 0, full); ok {
		t.Fatal("the twin projected into a full batch with no completion seen")
	}
	short, ok := steps(100, 0, full)
	if !ok || short < 2 {
		t.Fatalf("100-token outputs: %v steps (ok %v), want a wait of at least one step", short, ok)
	}
	long, _ := steps(1000, 0, full)
	behind, _ := steps(100, 20, full)
	if long <= short || behind <= short {
		t.Fatalf("steps: outputs of 100 %v, of 1000 %v, behind 20 waiting prompts %v", short, long, behind)
	}
	room := Engine{Decodes: 10, DecodeTokens: 10_000}
	a, _ := steps(0, 0, room)
	b, _ := steps(100, 0, room)
	if a != b || a != 1 {
		t.Fatalf("with room: %v steps without completions seen, %v with; want 1", a, b)
	}
}

// TestCalendarTimesTheWave: a batch of maxRunning sequences that began
// together with a bound of 200 tokens frees its places together, when
// they reach it; a prompt behind them waits for that step, not for the
// one the mean rate gives. The wave comes as early as the share of the
// bound the responses use says, and without a step count or a learned
// share the mean rate decides as before.
func TestCalendarTimesTheWave(t *testing.T) {
	const addr = "10.0.0.1:8000"
	const bound = 200
	now := time.Unix(1_700_000_000, 0)
	// wait is the steps to the first token of a 100-token prompt on a
	// server whose batch began decoding at step 10 and is at step `at`,
	// with responses using `used` of their bound.
	wait := func(at uint32, used float64, withBound bool) float64 {
		m := New(Config{})
		b := 0
		if withBound {
			b = bound
		}
		m.ObserveOutput(addr, int(used*bound), 1, bound)
		for i := range maxRunning {
			tk := m.Routed(addr, now, 0, 100, b)
			m.FirstTokenAt(&tk, now, Engine{Decodes: float64(i), DecodeTokens: float64(i) * 100, Steps: 10}, nil)
		}
		eng := Engine{Decodes: maxRunning, DecodeTokens: maxRunning * 1000, Steps: at}
		s := m.Sample(addr, Features{Prefill: 100}, now, eng)
		if !s.twin.ok {
			t.Fatalf("no projection (step %d, share %v, bound %v)", at, used, withBound)
		}
		return s.twin.x[0]
	}
	tests := []struct {
		name      string
		at        uint32
		used      float64
		withBound bool
		want      float64 // steps, the first token's included
	}{
		// At step 60 a sequence has 51 tokens: 149 to go, the last in
		// the 149th step; the prompt runs in the next.
		{"50 steps into a 200-token wave", 60, 1, true, 150},
		{"190 steps in", 200, 1, true, 10},
		{"responses stop at half their bound", 60, 0.5, true, 50},
		// 151 tokens, past the 100 expected: due in (200-151)/2-1 =
		// 23.5 steps, so its place frees after the 24th.
		{"past the expected end: half the rest", 160, 0.5, true, 26},
		{"no bound: the mean rate", 60, 1, false, 2},
		{"no step count: the mean rate", 0, 1, true, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := wait(tt.at, tt.used, tt.withBound); got != tt.want {
				t.Fatalf("first token after %v steps, want %v", got, tt.want)
			}
		})
	}
}

// TestTokensPerStepLearned: where the step clock counts one step in two
// (chunks carrying two tokens each), a completed stream teaches it, and a
// full batch's wave is timed in tokens as where every step is counted.
func TestTokensPerStepLearned(t *testing.T) {
	const addr = "10.0.0.1:8000"
	now := time.Unix(1_700_000_000, 0)
	m := New(Config{})
	m.ObserveOutput(addr, 200, 1, 200)
	tk := m.Routed(addr, now, 0, 100, 200)
	m.FirstTokenAt(&tk, now, Engine{Steps: 10}, nil)
	m.Finished(&tk, 110, 201, 1) // 200 tokens after the first in 100 steps counted
	m.Finished(&tk, 500, 201, 1) // once only
	if f := m.Fits(); len(f) != 1 || f[0].TokensPerStep != 2 {
		t.Fatalf("fits %+v, want 2 tokens per step counted", f)
	}
	for i := range maxRunning {
		tk := m.Routed(addr, now, 0, 100, 200)
		m.FirstTokenAt(&tk, now, Engine{Decodes: float64(i), DecodeTokens: float64(i) * 100, Steps: 10}, nil)
	}
	// 25 steps counted: 51 tokens, as 50 steps into the wave at one a step.
	s := m.Sample(addr, Features{Prefill: 100}, now, Engine{Decodes: maxRunning, DecodeTokens: maxRunning * 1000, Steps: 35})
	if got := s.twin.x[0]; got != 150 {
		t.Fatalf("first token after %v steps, want 150", got)
	}
}

// TestCalendarLifecycle: a decoding sequence leaves the calendar when its
// response ends, one without a bound never enters it, and the calendar
// holds at most maxDecoding; an entry far past its bound (its end never
// reported) is dropped at the next projection that reads it.
func TestCalendarLifecycle(t *testing.T) {
	const addr = "10.0.0.1:8000"
	now := time.Unix(1_700_000_000, 0)
	m := New(Config{})
	m.ObserveOutput(addr, 100, 1, 100)
	first := func(bound int) Ticket {
		tk := m.Routed(addr, now, 0, 10, bound)
		m.FirstTokenAt(&tk, now, Engine{Steps: 1}, nil)
		return tk
	}
	size := func() int {
		e := m.fitOf(addr)
		e.twinMu.Lock()
		defer e.twinMu.Unlock()
		return len(e.tw.dec)
	}
	a, _ := first(100), first(0)
	if got := size(); got != 1 {
		t.Fatalf("calendar holds %d after a bounded and an unbounded first token, want 1", got)
	}
	m.Ended(&a)
	m.Ended(&a)
	if got := size(); got != 0 {
		t.Fatalf("calendar holds %d after the bounded one ended, want 0", got)
	}
	for range maxDecoding + 10 {
		first(100)
	}
	if got := size(); got != maxDecoding {
		t.Fatalf("calendar holds %d, want its bound %d", got, maxDecoding)
	}
	m.Sample(addr, Features{Prefill: 10}, now, Engine{Decodes: maxRunning, Steps: 1 + 2*100 + 65})
	if got := size(); got != 0 {
		t.Fatalf("calendar holds %d entries far past their bound, want 0", got)
	}
}

// BenchmarkPredictFullBatch is the twin's cost per candidate on a server
// whose batch is full (maxRunning decoding, 64 prompts waiting): the
// completions timed by the calendar (each sequence with a bound), and at
// the mean rate (none with one).
func BenchmarkPredictFullBatch(b *testing.B) {
	for _, bound := range []int{0, 200} {
		b.Run(fmt.Sprint("bound=", bound), func(b *testing.B) {
			const addr = "10.0.0.1:8000"
			now := time.Unix(1_700_000_000, 0)
			m := New(Config{})
			m.ObserveOutput(addr, 200, 1, 200)
			for i := range maxRunning {
				tk := m.Routed(addr, now, 0, 100, bound)
				m.FirstTokenAt(&tk, now, Engine{Decodes: float64(i), DecodeTokens: float64(i) * 100, Steps: uint32(1 + i%150)}, nil)
			}
			for range 64 {
				m.Routed(addr, now, 2048, 300, bound)
			}
			eng := Engine{Decodes: maxRunning, DecodeTokens: maxRunning * 2500, StepEnd: now, Steps: 160}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				f := Features{Prefill: 300, Cached: 2048}
				m.PredictLive(addr, &f, now.Add(time.Duration(i%1000)*time.Microsecond), eng)
			}
		})
	}
}

// TestCalendarAgesByTheCount: a calendar entry ages by the step count's
// differences modulo 2³², and one whose first token was recorded after
// the decision read the count (the count behind the entry's) is as old as
// its first token, not 2³² steps less one and dropped.
func TestCalendarAgesByTheCount(t *testing.T) {
	const addr = "10.0.0.1:8000"
	now := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name        string
		first, at   uint32
		want        float64 // steps to the first token of a prompt behind the full batch
		wantEntries int
	}{
		{"50 steps in", 10, 60, 150, maxRunning},
		{"50 steps in across the wrap", math.MaxUint32 - 19, 30, 150, maxRunning},
		{"the count read before the first tokens", 11, 10, 200, maxRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New(Config{})
			m.ObserveOutput(addr, 200, 1, 200)
			for i := range maxRunning {
				tk := m.Routed(addr, now, 0, 100, 200)
				m.FirstTokenAt(&tk, now, Engine{Decodes: float64(i), DecodeTokens: float64(i) * 100, Steps: tt.first}, nil)
			}
			s := m.Sample(addr, Features{Prefill: 100}, now, Engine{Decodes: maxRunning, DecodeTokens: maxRunning * 1000, Steps: tt.at})
			e := m.fitOf(addr)
			e.twinMu.Lock()
			n := len(e.tw.dec)
			e.twinMu.Unlock()
			if !s.twin.ok || s.twin.x[0] != tt.want || n != tt.wantEntries {
				t.Fatalf("first token after %v steps (ok %v), calendar %d; want %v, %d", s.twin.x[0], s.twin.ok, n, tt.want, tt.wantEntries)
			}
		})
	}
}
