package endpoints

import (
	"testing"
	"time"
)

func TestStepClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ms := time.Millisecond
	tests := []struct {
		name   string
		chunks []time.Duration // chunk arrival offsets from t0
		query  time.Duration
		want   time.Duration
	}{
		{"no chunks seen", nil, 0, 0},
		{"one step end: no length yet", []time.Duration{0}, ms, 0},
		{"steady 10 ms steps, 4 ms into the next", []time.Duration{0, 10 * ms, 20 * ms, 30 * ms}, 34 * ms, 6 * ms},
		{"chunks of one step coalesce", []time.Duration{0, 100 * time.Microsecond, 10 * ms, 10*ms + 200*time.Microsecond}, 12 * ms, 8 * ms},
		{"step overdue: nothing left", []time.Duration{0, 10 * ms}, 25 * ms, 0},
		{"an idle spell is not a step", []time.Duration{0, 10 * ms, 3 * time.Second}, 3*time.Second + 5*ms, 5 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEndpoint(Spec{Address: "10.0.0.1:8000"})
			for _, c := range tt.chunks {
				e.ObserveStep(at(c))
			}
			if got := e.StepRemaining(at(tt.query)); got != tt.want {
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
	for range 20 {
		now = now.Add(10 * time.Millisecond)
		e.ObserveStep(now)
	}
	now = now.Add(400 * time.Millisecond) // one heavy step
	e.ObserveStep(now)
	got := e.StepRemaining(now)
	if got <= 10*time.Millisecond || got >= 100*time.Millisecond {
		t.Fatalf("after 20 steps of 10 ms and one of 400 ms, the step estimate is %v; want between 10 and 100 ms", got)
	}
}
