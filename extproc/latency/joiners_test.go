package latency

import (
	"math"
	"testing"
	"time"
)

// TestJoinRateExpectation: the prompts expected within a wait are the
// recent rate times the wait, less ln 2 arrivals (the median count, so a
// join less likely than not adds nothing), within the room the step
// leaves; the sums decay with joinTau.
func TestJoinRateExpectation(t *testing.T) {
	const t0 = int64(1_700_000_000e9)
	// Ten 300-token prompts (100 cached each) in the last instant: a rate
	// of 10 / joinTau arrivals per ns as of t0.
	var j joinRate
	for range 10 {
		j.add(t0, 100, 300)
	}
	perArrival := func(wait, room int64, now int64) float64 {
		var s stepShape
		j.into(&s, now, wait, room)
		return s.tokens
	}
	tau := int64(joinTau)
	tests := []struct {
		name        string
		now         int64
		wait, room  int64
		wantArrived float64 // expected arrivals priced
	}{
		{"no wait", t0, 0, 8192, 0},
		{"under the median: none", t0, tau / 20, 8192, 0},    // mean 0.5 < ln 2
		{"a tenth of tau", t0, tau / 10, 8192, 1 - math.Ln2}, // mean 1
		{"half of tau", t0, tau / 2, 8192, 5 - math.Ln2},
		{"capped by the room", t0, tau / 2, 600, 2},
		{"no room", t0, tau / 2, 0, 0},
		{"decayed by tau", t0 + tau, tau / 2, 8192, 5/math.E - math.Ln2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := perArrival(tt.wait, tt.room, tt.now); math.Abs(got-300*tt.wantArrived) > 1e-6 {
				t.Fatalf("tokens %v, want %v", got, 300*tt.wantArrived)
			}
		})
	}
	// into does not change the sums it reads.
	if a, b := perArrival(tau/2, 8192, t0+tau), perArrival(tau/2, 8192, t0+tau); a != b {
		t.Fatalf("into changed the sums: %v then %v", a, b)
	}
	// The chunks are shaped like the arrivals: each 300 tokens after 100
	// cached ones.
	var s stepShape
	j.into(&s, t0, tau/2, 8192)
	n := 5 - math.Ln2
	if want := n * (300*100 + 300*301/2); math.Abs(s.attn-want) > 1e-6*want || math.Abs(s.seqs-n) > 1e-9 || math.Abs(s.ctx-n*400) > 1e-6 {
		t.Fatalf("shape %+v, want %v arrivals of 300 after 100", s, n)
	}
}

// TestProjectionPricesExpectedJoiners: on a server that has been
// receiving short prompts, a request whose last step begins later is
// predicted longer by the prompts expected meanwhile, while the sample
// the step cost learns from (its hindsight) is the step without them; a
// held prompt never counts as a joiner.
func TestProjectionPricesExpectedJoiners(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	const addr = "10.0.0.1:8000"
	busy := func(hold int64, uncached int) (*Model, Sample) {
		m := New(Config{HoldTokens: hold})
		// A burst of short turns 200 ms ago, already past their first
		// token: the server is idle now but has been receiving about 100
		// prompts a second.
		past := now.Add(-200 * time.Millisecond)
		for range 20 {
			tk := m.Routed(addr, past, 1000, uncached, 0)
			m.FirstTokenAt(&tk, past.Add(time.Millisecond), Engine{}, nil)
		}
		// A long prompt in prefill: the request waits for its steps.
		m.Routed(addr, now, 0, 20_000, 0)
		return m, m.Sample(addr, Features{Prefill: 300, Cached: 1000}, now, Engine{})
	}
	_, joined := busy(0, 300)
	if joined.twin.joiners <= 0 {
		t.Fatalf("no joiners priced behind a 20k-token prompt on a busy server: %+v", joined.twin)
	}
	if joined.twin.hindsight != joined.twin.x {
		t.Fatal("the hindsight is not the projected steps without the joiners")
	}
	m, _ := busy(0, 300)
	c := m.pool.published.Load()
	if got, base := c.twinPrediction(&joined.twin), twinTTFT(&c.twin, &joined.twin); got <= base {
		t.Fatalf("prediction %v not above the twin's %v with joiners expected", got, base)
	}
	// Under a hold of 256 tokens the 300-token arrivals are held while a
	// prompt is in prefill: none of them can join.
	if _, held := busy(256, 300); held.twin.joiners != 0 {
		t.Fatalf("held arrivals priced as joiners: %v s", held.twin.joiners)
	}
	// Nothing queued: the request's step begins at its arrival, no wait.
	idle := New(Config{})
	past := now.Add(-200 * time.Millisecond)
	for range 20 {
		tk := idle.Routed(addr, past, 1000, 300, 0)
		idle.FirstTokenAt(&tk, past.Add(time.Millisecond), Engine{}, nil)
	}
	if s := idle.Sample(addr, Features{Prefill: 300, Cached: 1000}, now, Engine{}); s.twin.joiners != 0 {
		t.Fatalf("joiners priced with no wait: %v s", s.twin.joiners)
	}
}

// TestJoinWeightLearnsForMAPE: the joiners' weight falls while the
// predictions that priced them come out long, rises while they come out
// short, stays within [0, maxJoin], and ignores samples that priced none.
func TestJoinWeightLearnsForMAPE(t *testing.T) {
	tests := []struct {
		name             string
		joiners, p, ttft float64
		n                int
		want             func(float64) bool
	}{
		{"over-predicted: down to zero", 0.02, 0.1, 0.05, 1000, func(w float64) bool { return w == 0 }},
		{"under-predicted: up to the bound", 0.02, 0.05, 0.1, 1000, func(w float64) bool { return w == maxJoin }},
		{"one over-prediction: a step down by the joiners' share", 0.02, 0.1, 0.05, 1, func(w float64) bool {
			return math.Abs(w-(joinPrior-joinStep*0.02/0.05)) < 1e-12
		}},
		{"nothing priced: unchanged", 0, 0.1, 0.05, 1000, func(w float64) bool { return w == joinPrior }},
		{"exact: unchanged", 0.02, 0.05, 0.05, 1000, func(w float64) bool { return w == joinPrior }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFit(Config{}.withDefaults(), nil)
			for range tt.n {
				f.learnJoinLocked(tt.joiners, tt.p, tt.ttft)
			}
			if !tt.want(f.join) {
				t.Fatalf("weight %v", f.join)
			}
		})
	}
}
