package endpoints

import (
	"testing"
	"time"
)

// chunk is one streamed chunk: its time from the start, and the gap to the
// same stream's previous chunk (zero for a stream's first).
type chunk struct{ at, itl time.Duration }

func TestStepClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	tests := []struct {
		name   string
		chunks []chunk
		query  time.Duration
		want   time.Duration
	}{
		{"no chunks seen", nil, 0, 0},
		{"first chunks only: no step length yet", []chunk{{0, 0}, {5 * ms, 0}}, 6 * ms, 0},
		{"steady 10 ms steps, 4 ms into the next", []chunk{{0, 0}, {10 * ms, 10 * ms}, {20 * ms, 10 * ms}, {30 * ms, 10 * ms}}, 34 * ms, 6 * ms},
		{"another stream's first chunk is a step end too", []chunk{{0, 0}, {10 * ms, 10 * ms}, {13 * ms, 0}}, 15 * ms, 8 * ms},
		{"step overdue: nothing left", []chunk{{0, 0}, {10 * ms, 10 * ms}}, 25 * ms, 0},
		{"a stalled stream's gap is not a step", []chunk{{0, 0}, {10 * ms, 10 * ms}, {3 * time.Second, 3*time.Second - 10*ms}}, 3*time.Second + 5*ms, 5 * ms},
		{"a late report does not move the clock back", []chunk{{0, 0}, {20 * ms, 20 * ms}, {15 * ms, 0}}, 25 * ms, 15 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEndpoint(Spec{Address: "10.0.0.1:8000"})
			for _, c := range tt.chunks {
				e.ObserveStep(t0.Add(c.at), c.itl)
			}
			if got := e.StepRemaining(t0.Add(tt.query)); got != tt.want {
				t.Fatalf("StepRemaining = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestStepClockAverages: a change of step length moves the estimate
// gradually, so that one long step (a prefill chunk) does not make every
// decode step look long.
func TestStepClockAverages(t *testing.T) {
	e := NewEndpoint(Spec{Address: "10.0.0.1:8000"})
	now := time.Unix(1000, 0)
	e.ObserveStep(now, 0)
	for range 20 {
		now = now.Add(10 * time.Millisecond)
		e.ObserveStep(now, 10*time.Millisecond)
	}
	now = now.Add(400 * time.Millisecond) // one heavy step
	e.ObserveStep(now, 400*time.Millisecond)
	got := e.StepRemaining(now)
	if got <= 10*time.Millisecond || got >= 100*time.Millisecond {
		t.Fatalf("after 20 steps of 10 ms and one of 400 ms, the step estimate is %v; want between 10 and 100 ms", got)
	}
}

// TestStepCount: the chunks of one step end, however many streams send
// them and however they straggle within half a step, count one step, and
// a short step counts after long ones; a chunk out of order counts none.
func TestStepCount(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name   string
		chunks []chunk
		want   uint32
	}{
		{"none", nil, 0},
		{"one stream's first chunk", []chunk{{0, 0}}, 1},
		{"three streams at one step end", []chunk{{0, 0}, {0, 0}, {0, 0}}, 1},
		{"three steady steps of two streams", []chunk{{0, 0}, {0, 0}, {10 * ms, 10 * ms}, {10 * ms, 10 * ms}, {20 * ms, 10 * ms}, {20 * ms, 10 * ms}}, 3},
		{"stragglers within half a step", []chunk{{0, 0}, {10 * ms, 10 * ms}, {11 * ms, 10 * ms}, {13 * ms, 10 * ms}, {20 * ms, 10 * ms}}, 3},
		{"a late report", []chunk{{0, 0}, {10 * ms, 10 * ms}, {5 * ms, 0}}, 2},
		{"a short step after long ones", []chunk{{0, 0}, {400 * ms, 400 * ms}, {800 * ms, 400 * ms}, {820 * ms, 20 * ms}, {820 * ms, 20 * ms}}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEndpoint(Spec{Address: "10.0.0.1:8000"})
			t0 := time.Unix(1000, 0)
			for _, c := range tt.chunks {
				e.ObserveStep(t0.Add(c.at), c.itl)
			}
			if got := e.Steps(); got != tt.want {
				t.Fatalf("Steps = %d, want %d", got, tt.want)
			}
		})
	}
}
