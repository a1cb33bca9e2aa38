package latency

import (
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
			m.ObserveOutput(addr, output)
		}
		for range queued {
			m.Routed(addr, now, 0, 100)
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
