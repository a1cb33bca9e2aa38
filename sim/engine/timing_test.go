package engine

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// presetRow is what TIMING.md tabulates for one preset, all measured by
// running the engine on a virtual clock.
type presetRow struct {
	ttft128, ttft1k, ttft8k time.Duration // one request, idle engine
	itl1, itl8, itl64       time.Duration // mean ITL at concurrency 1, 8, 64 (1k-token prompts)
	latency8x32x128         time.Duration // vLLM's latency benchmark: 8 × (32 in, 128 out), end to end
	kvTokens                int
}

func measurePreset(t *testing.T, p Preset) presetRow {
	t.Helper()
	run := func(n, in, out int) map[string]*outcome {
		clock := NewVirtualClock(epoch)
		e := newTestEngine(t, Config{Timing: p.Timing, Clock: clock})
		r := rand.New(rand.NewPCG(uint64(n), uint64(in)))
		arr := make([]arrival, n)
		for i := range arr {
			arr[i] = arrival{0, Request{ID: strconv.Itoa(i), Prompt: randomPrompt(r, in), MaxTokens: out}}
		}
		return simulate(t, e, clock, arr)
	}
	itl := func(n int) time.Duration {
		var gaps []time.Duration
		for _, o := range run(n, 1024, 128) {
			for i := 1; i < len(o.tokenAt); i++ {
				gaps = append(gaps, o.tokenAt[i]-o.tokenAt[i-1])
			}
		}
		return mean(gaps)
	}
	var row presetRow
	row.ttft128 = run(1, 128, 1)["0"].ttft
	row.ttft1k = run(1, 1024, 1)["0"].ttft
	row.ttft8k = run(1, 8192, 1)["0"].ttft
	row.itl1, row.itl8, row.itl64 = itl(1), itl(8), itl(64)
	for _, o := range run(8, 32, 128) {
		row.latency8x32x128 = max(row.latency8x32x128, o.tokenAt[len(o.tokenAt)-1])
	}
	cfg, err := Config{Timing: p.Timing, Clock: NewVirtualClock(epoch)}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	row.kvTokens = cfg.NumGPUBlocks * cfg.BlockSize
	return row
}

// TestPresetTable prints the table in TIMING.md (go test -run
// TestPresetTable -v) and checks the orderings any roofline must keep.
func TestPresetTable(t *testing.T) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
	rows := map[string]presetRow{}
	t.Log("| preset | TTFT 128 | TTFT 1k | TTFT 8k | ITL c=1 | ITL c=8 | ITL c=64 | 8×(32→128) e2e | KV tokens |")
	t.Log("|---|---|---|---|---|---|---|---|---|")
	for _, p := range Presets() {
		r := measurePreset(t, p)
		rows[p.Name] = r
		t.Logf("| %s | %s | %s | %s | %s | %s | %s | %s | %d |", p.Name, ms(r.ttft128), ms(r.ttft1k), ms(r.ttft8k),
			ms(r.itl1), ms(r.itl8), ms(r.itl64), ms(r.latency8x32x128), r.kvTokens)
		if !(r.ttft128 < r.ttft1k && r.ttft1k < r.ttft8k) {
			t.Errorf("%s: TTFT not increasing with prompt length", p.Name)
		}
		if !(r.itl1 <= r.itl8 && r.itl8 <= r.itl64) {
			t.Errorf("%s: ITL not increasing with batch size", p.Name)
		}
	}
	for _, pair := range [][2]string{{"llama-3.1-8b-h200", "llama-3.1-8b-h100"}, {"qwen3-32b-tp2-h200", "qwen3-32b-tp2-h100"}} {
		fast, slow := rows[pair[0]], rows[pair[1]]
		if fast.itl8 >= slow.itl8 || fast.kvTokens <= slow.kvTokens {
			t.Errorf("%s not faster and larger than %s", pair[0], pair[1])
		}
	}
}

func TestStepDurationShape(t *testing.T) {
	p, _ := LookupPreset("llama-3.1-8b-h100")
	tm := p.Timing
	tests := []struct {
		name        string
		small, big  Shape
		wantGreater bool
	}{
		{"empty step is free", Shape{}, Shape{}, false},
		{"more decode context costs more", Shape{DecodeSeqs: 64, SampledSeqs: 64, ContextTokens: 64 * 1000},
			Shape{DecodeSeqs: 64, SampledSeqs: 64, ContextTokens: 64 * 8000}, true},
		{"a long prefill is compute bound and grows", Shape{PrefillTokens: 2048, SampledSeqs: 1, ContextTokens: 2048, AttentionPairs: 2048 * 2049 / 2},
			Shape{PrefillTokens: 8192, SampledSeqs: 1, ContextTokens: 8192, AttentionPairs: 8192 * 8193 / 2}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tm.StepDuration(tc.small), tm.StepDuration(tc.big)
			if tc.wantGreater != (b > a) {
				t.Errorf("durations %v then %v", a, b)
			}
		})
	}
	if d := tm.StepDuration(Shape{}); d != 0 {
		t.Errorf("empty step takes %v", d)
	}
}
