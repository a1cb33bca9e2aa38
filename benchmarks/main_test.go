package benchmarks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/internal/progress"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/sim/engine"
)

// smallArgs is a shared-prefix run small enough for -race: 3 replicas of
// the smallest preset, ~100 requests whose load queues the random policy.
var smallArgs = []string{
	"--workload", "shared-prefix", "--replicas", "3", "--preset", "qwen3-0.6b-h100",
	"--groups", "6", "--prefix-tokens", "3000", "--suffix-tokens", "100", "--output-tokens", "20",
	"--ramp", "20,60", "--stage-duration", "1.5s", "--seed", "5",
}

func TestEndToEndAllPolicies(t *testing.T) {
	dir := t.TempDir()
	var log bytes.Buffer
	if err := Main(context.Background(), append(smallArgs, "--out", dir), io.Discard, &log); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	var res Results
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	by := map[string]Summary{}
	for _, s := range res.Policies {
		by[s.Name] = s
		if s.Requests < 80 || s.Failed != 0 {
			t.Errorf("%s: %d requests completed, %d failed", s.Name, s.Requests, s.Failed)
		}
		if s.PrefixHitRatio < 0 || s.PrefixHitRatio > 1 {
			t.Errorf("%s: hit ratio %v", s.Name, s.PrefixHitRatio)
		}
		if !(s.TTFTP50 > 0 && s.TTFTP50 <= s.TTFTP90 && s.TTFTP90 <= s.TTFTP99) || s.TPOTP50 <= 0 || s.ThroughputOutputTokS <= 0 {
			t.Errorf("%s: implausible latencies %+v", s.Name, s)
		}
		if len(s.Stages) != 2 {
			t.Errorf("%s: %d stages", s.Name, len(s.Stages))
		}
	}
	for _, p := range Policies {
		if _, ok := by[p.Name]; !ok && p.Name != "precise" {
			t.Errorf("policy %s missing from results", p.Name)
		}
	}
	if o, r := by["oracle"], by["random"]; o.PrefixHitRatio < r.PrefixHitRatio {
		t.Errorf("oracle hit ratio %.3f below random's %.3f", o.PrefixHitRatio, r.PrefixHitRatio)
	}
	for _, f := range []string{"results.md", "ttft_cdf.png", "ttft_vs_qps.png", "throughput_vs_qps.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestSameSeedSameResults(t *testing.T) {
	run := func() []byte {
		dir := t.TempDir()
		args := append(smallArgs, "--policies", "random,approx,precise,oracle", "--sweep", "1,2", "--out", dir)
		if err := Main(context.Background(), args, io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(dir, "results.json"))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	if a, b := run(), run(); !bytes.Equal(a, b) {
		t.Fatalf("results differ between runs of the same seed:\n%s\n---\n%s", a, b)
	}
}

func TestMainUsage(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--workload", "shared-prefix"},
		{"--out", dir},
		{"--out", dir, "--trace", "x", "--workload", "chat"},
		{"--out", dir, "--workload", "nope"},
		{"--out", dir, "--workload", "chat", "--preset", "nope"},
		{"--out", dir, "--workload", "chat", "--policies", "nope"},
		{"--out", dir, "--workload", "chat", "--sweep", "1,-2"},
		{"--out", dir, "--workload", "chat", "--burst", "0"},
		{"--out", dir, "--trace", "x", "--burst", "2"},
		{"--out", dir, "--workload", "chat", "--arrival-quantum", "-1s"},
		{"--out", dir, "--workload", "chat", "--preset", "llama-3.1-8b-h100", "--presets", "llama-3.1-8b-h200:2"},
		{"--out", dir, "--workload", "chat", "--replicas", "3", "--presets", "llama-3.1-8b-h200:2"},
		{"--out", dir, "--workload", "chat", "--presets", "llama-3.1-8b-h200:2,nope:1"},
		{"--out", dir, "--workload", "chat", "--presets", "llama-3.1-8b-h200:1,qwen3-0.6b-h100:1"},
		{"--out", dir, "--workload", "chat", "--slo-fraction", "0.5"},
		{"--out", dir, "--workload", "chat", "--slo-ttft", "1s", "--slo-fraction", "0"},
		{"--out", dir, "--workload", "chat", "--slo-ttft", "1s", "--slo-fraction", "1.5"},
		{"--out", dir, "--workload", "chat", "--slo-tpot", "10us"},
		{"--bogus"},
	} {
		if err := Main(context.Background(), args, io.Discard, io.Discard); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
}

// The chat workload and a --config policy run end to end.
func TestChatWithConfigFile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "mine.yaml")
	if err := os.WriteFile(cfg, Policies[0].Config, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--workload", "chat", "--replicas", "2", "--preset", "qwen3-0.6b-h100", "--ramp", "2", "--stage-duration", "10s",
		"--policies", "approx", "--config", cfg, "--out", dir}
	if err := Main(context.Background(), args, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	var res Results
	if err := json.Unmarshal(data, &res); err != nil || len(res.Policies) != 2 || res.Policies[1].Name != "mine" {
		t.Fatalf("results %s: %v", data, err)
	}
	// Multi-turn chat reuses each conversation's history.
	if h := res.Policies[0].PrefixHitRatio; h < 0.3 {
		t.Errorf("approx hit ratio on chat %.3f", h)
	}
}

// BenchmarkMooncake8Replicas replays the shared Mooncake trace on 8
// replicas under the precise policy and reports simulated requests per
// wall-clock second.
func BenchmarkMooncake8Replicas(b *testing.B) {
	f, err := os.Open(filepath.Join(testutil.SharedDir(b), "traces", "mooncake_synthetic_trace.jsonl"))
	if err != nil {
		b.Skipf("trace absent: %v", err)
	}
	reqs, err := workload.LoadMooncake(f)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	preset, _ := engine.LookupPreset("llama-3.1-8b-h100")
	for _, p := range Policies {
		if p.Name != "random" && p.Name != "precise" {
			continue
		}
		b.Run(p.Name, func(b *testing.B) {
			start := time.Now()
			for b.Loop() {
				if _, err := cluster.Run(context.Background(), cluster.Options{Replicas: 8, Preset: preset, Seed: 1}, p, reqs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(reqs)*b.N)/time.Since(start).Seconds(), "sim-req/s")
		})
	}
}

func TestProgressBar(t *testing.T) {
	var b bytes.Buffer
	progressBar(&b, "precise ×1")(30, 40)
	got := b.String()
	if !bytes.HasPrefix(b.Bytes(), []byte("\rprecise ×1")) || !bytes.Contains(b.Bytes(), []byte("[##############################..........] 30/40")) {
		t.Fatalf("progress line %q", got)
	}
	if progress.IsTerminal(&b) {
		t.Fatal("a buffer is not a terminal")
	}
}

// A bursty run on a mixed fleet with an SLO on half the requests reports
// per preset and SLO attainment over the requests that carried it.
func TestMixedFleetWithSLO(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--workload", "shared-prefix", "--presets", "llama-3.1-8b-h100:2,llama-3.1-8b-h200:1",
		"--groups", "6", "--prefix-tokens", "2000", "--suffix-tokens", "100", "--output-tokens", "20",
		"--ramp", "20", "--stage-duration", "5s", "--burst", "4", "--arrival-quantum", "500ms",
		"--slo-ttft", "300ms", "--slo-tpot", "30ms", "--slo-fraction", "0.5", "--policies", "random,load", "--seed", "2", "--out", dir}
	if err := Main(context.Background(), args, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res Results
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	if res.Replicas != 3 || len(res.Policies) != 2 {
		t.Fatalf("%d replicas, %d policies", res.Replicas, len(res.Policies))
	}
	for _, s := range res.Policies {
		total := s.Requests + s.Failed
		if s.SLO == nil || s.SLO.Requests < total/4 || s.SLO.Requests > 3*total/4 || s.SLO.TTFT != 0.3 || s.SLO.TPOT != 0.03 {
			t.Errorf("%s: SLO %+v of %d requests", s.Name, s.SLO, total)
		} else if s.SLO.BothMet > s.SLO.TTFTMet || s.SLO.BothMet > s.SLO.TPOTMet {
			t.Errorf("%s: both met more often than one: %+v", s.Name, s.SLO)
		}
		if len(s.Presets) != 2 || s.Presets[0].Requests+s.Presets[1].Requests != s.Requests {
			t.Errorf("%s: presets %+v for %d requests", s.Name, s.Presets, s.Requests)
		}
		if s.Prediction != nil {
			t.Errorf("%s: predictions %+v without a predictor", s.Name, s.Prediction)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "results.md"))
	for _, w := range []string{"both SLOs met", "By preset", "llama-3.1-8b-h200", "bursts of 4", "floored to 500ms"} {
		if !bytes.Contains(md, []byte(w)) {
			t.Errorf("results.md lacks %q:\n%s", w, md)
		}
	}
}
