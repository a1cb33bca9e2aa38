package engine

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestSchedulingPolicyOrder admits one request at a time (max_num_seqs 1)
// behind a running one and reads the order the rest are served in.
func TestSchedulingPolicyOrder(t *testing.T) {
	type req struct {
		id       string
		priority int
	}
	queue := []req{{"b", 5}, {"c", 0}, {"d", 5}, {"e", -3}, {"f", 0}}
	tests := []struct {
		policy SchedulingPolicy
		want   []string
	}{
		{"", []string{"a", "b", "c", "d", "e", "f"}},
		{SchedulingFCFS, []string{"a", "b", "c", "d", "e", "f"}},
		// Lower value first; ties in arrival order.
		{SchedulingPriority, []string{"a", "e", "c", "f", "b", "d"}},
	}
	for _, tc := range tests {
		t.Run(string(tc.policy), func(t *testing.T) {
			clock := NewVirtualClock(epoch)
			cfg := testConfig(clock, nil)
			cfg.MaxNumSeqs, cfg.SchedulingPolicy = 1, tc.policy
			e := newTestEngine(t, cfg)
			r := rand.New(rand.NewPCG(1, 1))
			arr := []arrival{{0, Request{ID: "a", Prompt: randomPrompt(r, 64), MaxTokens: 4, Priority: 9}}}
			for _, q := range queue {
				arr = append(arr, arrival{1, Request{ID: q.id, Prompt: randomPrompt(r, 64), MaxTokens: 4, Priority: q.priority}})
			}
			out := simulate(t, e, clock, arr)
			var got []string
			for id := range out {
				got = append(got, id)
			}
			slices.SortFunc(got, func(x, y string) int { return cmp.Compare(out[x].tokenAt[0], out[y].tokenAt[0]) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("served in order %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPriorityPreemptionVictim runs out of blocks while three requests
// decode: FCFS preempts the newest, priority the one with the largest
// priority value, even when it is the oldest and first in the batch.
func TestPriorityPreemptionVictim(t *testing.T) {
	tests := []struct {
		policy     SchedulingPolicy
		priorities [3]int // of a, b, c, which arrive in that order
		victim     string
	}{
		{SchedulingFCFS, [3]int{5, 0, 0}, "c"},
		{SchedulingPriority, [3]int{5, 0, 0}, "a"},
		{SchedulingPriority, [3]int{0, 5, 0}, "b"},
		{SchedulingPriority, [3]int{0, 0, 0}, "c"},
	}
	for _, tc := range tests {
		t.Run(string(tc.policy)+"/"+tc.victim, func(t *testing.T) {
			clock := NewVirtualClock(epoch)
			cfg := testConfig(clock, nil)
			cfg.SchedulingPolicy = tc.policy
			// 3 × (6 prompt + 7 output blocks) would be needed at the end.
			cfg.NumGPUBlocks = 30
			e := newTestEngine(t, cfg)
			r := rand.New(rand.NewPCG(3, 4))
			var arr []arrival
			for i, id := range []string{"a", "b", "c"} {
				// a runs first, alone; b and c join it a step later.
				arr = append(arr, arrival{time.Duration(min(i, 1)), Request{ID: id, Prompt: randomPrompt(r, 96), MaxTokens: 112, Priority: tc.priorities[i]}})
			}
			out := simulate(t, e, clock, arr)
			var preempted []string
			for id, o := range out {
				if o.finished.Preemptions > 0 {
					preempted = append(preempted, id)
				}
				if len(o.tokens) != 112 {
					t.Errorf("%s produced %d tokens", id, len(o.tokens))
				}
			}
			if len(preempted) == 0 || !slices.Contains(preempted, tc.victim) {
				t.Fatalf("preempted %v, want %s among them", preempted, tc.victim)
			}
			first := tc.victim
			for _, id := range preempted {
				if out[id].finished.Preemptions > out[first].finished.Preemptions {
					first = id
				}
			}
			if first != tc.victim {
				t.Errorf("most preempted %s, want %s", first, tc.victim)
			}
		})
	}
}

func TestSchedulingPolicyConfig(t *testing.T) {
	cfg := testConfig(NewVirtualClock(epoch), nil)
	cfg.SchedulingPolicy = "lifo"
	if _, err := New(cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("policy lifo: err %v, want ErrConfig", err)
	}
}

// TestScheduledSumsToShape checks that the per-request breakdown of every
// step adds up to the shape the step was priced on, so what-if prices of
// part of a batch are built from the same terms.
func TestScheduledSumsToShape(t *testing.T) {
	clock := NewVirtualClock(epoch)
	cfg := testConfig(clock, nil)
	cfg.MaxNumBatchedTokens = 512 // chunked prefills too
	e := newTestEngine(t, cfg)
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 40 {
		if err := e.Add(Request{ID: string(rune('A' + i)), Prompt: randomPrompt(r, 50+r.IntN(900)), MaxTokens: 1 + r.IntN(30)}); err != nil {
			t.Fatal(err)
		}
	}
	steps := 0
	for res := e.Step(); !res.Idle(); res = e.Step() {
		var sh Shape
		for _, q := range res.Scheduled {
			q.Add(&sh)
		}
		if sh != res.Shape {
			t.Fatalf("step %d: scheduled parts sum to %+v, shape %+v", steps, sh, res.Shape)
		}
		clock.Advance(res.Duration)
		steps++
	}
	if steps < 10 {
		t.Fatalf("only %d steps", steps)
	}
}
