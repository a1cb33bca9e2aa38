package engine

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// BenchmarkHourTrace simulates one Llama-3.1-8B/H100 replica for an hour of
// Poisson traffic at 5 req/s (1,000-token prompts, 150 output tokens) on
// the virtual clock, the unit of work of the cluster benchmark.
func BenchmarkHourTrace(b *testing.B) {
	const (
		rate   = 5.0
		window = time.Hour
	)
	r := rand.New(rand.NewPCG(42, 42))
	var arr []arrival
	for at := 0.0; ; {
		at += r.ExpFloat64() / rate
		d := time.Duration(at * float64(time.Second))
		if d >= window {
			break
		}
		arr = append(arr, arrival{at: d, req: Request{ID: strconv.Itoa(len(arr)), Prompt: randomPrompt(r, 1000), MaxTokens: 150}})
	}
	b.ReportAllocs()
	b.ResetTimer()
	var simulated time.Duration
	var steps int64
	for b.Loop() {
		clock := NewVirtualClock(epoch)
		cfg := testConfig(clock, nil)
		cfg.MaxWaiting = len(arr)
		e := newTestEngine(b, cfg)
		simulate(b, e, clock, arr)
		simulated += clock.Now().Sub(epoch)
		steps += e.Metrics().Steps
	}
	wall := b.Elapsed().Seconds()
	b.ReportMetric(simulated.Seconds()/wall, "sim-s/wall-s")
	b.ReportMetric(float64(steps)/wall, "steps/s")
	b.ReportMetric(float64(len(arr)), "requests")
}
