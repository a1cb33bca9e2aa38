package vllmserver

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/internal/vllm"
)

// The per-request histograms vLLM's dashboards read: token counts and
// parameters per request, and the phases of each request, which add up:
// inference is prefill plus decode exactly (the engine's clock), and end to
// end spans queue plus inference.
func TestPerRequestHistograms(t *testing.T) {
	o := testOptions(t)
	s := startServer(t, o)
	const requests = 3
	var prompt, generated int
	for i := range requests {
		r := complete(t, s, "/v1/completions", map[string]any{"model": o.Model, "prompt": "one two three four five", "max_tokens": 4 + i})
		prompt += r.Usage.PromptTokens
		generated += r.Usage.CompletionTokens
	}
	sum := func(name string) float64 {
		t.Helper()
		v, n := histogramSum(t, s, name)
		if n != requests {
			t.Errorf("%s: %d observations, want %d", name, n, requests)
		}
		return v
	}
	if got := sum(vllm.MetricRequestPromptTokens); got != float64(prompt) {
		t.Errorf("prompt tokens sum %v, want %d", got, prompt)
	}
	if got := sum(vllm.MetricRequestGenerationTokens); got != float64(generated) {
		t.Errorf("generation tokens sum %v, want %d", got, generated)
	}
	if got := sum(vllm.MetricRequestMaxNumGenerationTokens); got != float64(generated) {
		t.Errorf("max generation tokens sum %v, want %d", got, generated)
	}
	if got := sum(vllm.MetricRequestParamsMaxTokens); got != 4+5+6 {
		t.Errorf("max_tokens sum %v, want 15", got)
	}
	if got := sum(vllm.MetricRequestParamsN); got != requests {
		t.Errorf("n sum %v, want %d", got, requests)
	}
	queue, prefill, decode := sum(vllm.MetricRequestQueueTimeSeconds), sum(vllm.MetricRequestPrefillTimeSeconds), sum(vllm.MetricRequestDecodeTimeSeconds)
	inference, e2e := sum(vllm.MetricRequestInferenceTimeSeconds), sum(vllm.MetricE2ERequestLatencySeconds)
	sum(vllm.MetricRequestTimePerOutputTokenSeconds)
	sum(vllm.MetricTimePerPrefillTokenSeconds)
	if prefill <= 0 || decode <= 0 || queue < 0 {
		t.Errorf("phases: queue %v prefill %v decode %v", queue, prefill, decode)
	}
	if math.Abs(inference-(prefill+decode)) > 1e-9 {
		t.Errorf("inference %v != prefill %v + decode %v", inference, prefill, decode)
	}
	// The handler reads the finish on the engine's clock when it gets to
	// it, possibly after the last token: end to end covers the phases.
	if e2e < queue+inference-1e-9 {
		t.Errorf("e2e %v < queue %v + inference %v", e2e, queue, inference)
	}
	// One observation per token gap, under both the new and the old name.
	_, itl := histogramSum(t, s, vllm.MetricInterTokenLatencySeconds)
	_, old := histogramSum(t, s, vllm.MetricTimePerOutputTokenSeconds)
	if itl != uint64(generated-requests) || old != itl {
		t.Errorf("token gaps: itl %d, time_per_output_token %d, want %d", itl, old, generated-requests)
	}
	// Every engine step that computed tokens is an iteration.
	steps, n := histogramSum(t, s, vllm.MetricIterationTokensTotal)
	if n == 0 || steps < float64(prompt) {
		t.Errorf("iteration tokens: %d steps computing %v tokens, want at least the %d prompt tokens", n, steps, prompt)
	}
}

func TestBuckets125(t *testing.T) {
	for _, tc := range []struct {
		limit int
		want  []float64
	}{{0, nil}, {1, []float64{1}}, {100, []float64{1, 2, 5, 10, 20, 50, 100}}, {4096, []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}}} {
		got := buckets125(tc.limit)
		if len(got) != len(tc.want) {
			t.Fatalf("buckets125(%d) = %v, want %v", tc.limit, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("buckets125(%d) = %v, want %v", tc.limit, got, tc.want)
			}
		}
	}
}
