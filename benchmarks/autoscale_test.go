package benchmarks

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// steppedLoad is a stepped ramp up to a peak that needs the whole fleet and
// back down: llm-d's SLO-aware benchmark in small (Qwen3-32B TP=2 on H100,
// 4000-token prompts, SLOs 3 s / 100 ms), so that it runs in seconds.
var steppedLoad = []string{
	"--workload", "shared-prefix", "--groups", "1", "--prefix-tokens", "0", "--suffix-tokens", "4000", "--output-tokens", "250",
	"--ramp", "1,2,3,4,5,4,2,1", "--stage-duration", "2m", "--preset", "qwen3-32b-tp2-h100", "--policies", "load",
	"--slo-ttft", "3s", "--slo-tpot", "100ms", "--autoscale-min", "2", "--autoscale-max", "4", "--startup-delay", "60s",
}

func runScaling(t *testing.T, policies string) map[string]ScalingSummary {
	t.Helper()
	out := t.TempDir()
	var stderr bytes.Buffer
	args := append(append([]string{}, steppedLoad...), "--autoscale", policies, "--out", out)
	if err := Main(context.Background(), args, nil, &stderr); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	t.Log("\n" + stderr.String())
	raw, err := os.ReadFile(filepath.Join(out, "autoscale.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res AutoscaleResults
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"autoscale.md", "autoscale-replicas.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	by := map[string]ScalingSummary{}
	for _, s := range res.Policies {
		by[s.Policy] = s
	}
	return by
}

// TestSLOScalingOnSteppedLoad is the acceptance check: on a
// stepped load, SLO-saturation scaling meets the SLOs for at least 95% of
// requests on fewer GPU-hours than the fixed fleet sized for the peak, and
// GPU-utilisation scaling, which reads a busy GPU as a full one under
// continuous batching, spends more GPU-hours than SLO scaling for it.
func TestSLOScalingOnSteppedLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates three 16-minute runs")
	}
	by := runScaling(t, "fixed,gpu-util,slo")
	fixed, gpu, slo := by["fixed"], by["gpu-util"], by["slo"]
	if fixed.SLO == nil || slo.SLO == nil || gpu.SLO == nil {
		t.Fatal("no SLO attainment reported")
	}
	if fixed.SLO.BothMet < 0.99 {
		t.Errorf("the fixed fleet sized for the peak meets the SLOs for %.1f%% only: the load is not what the test means", 100*fixed.SLO.BothMet)
	}
	if slo.SLO.BothMet < 0.95 {
		t.Errorf("SLO scaling met the SLOs for %.1f%% of requests, want ≥ 95%%", 100*slo.SLO.BothMet)
	}
	if !(slo.GPUHours < fixed.GPUHours) {
		t.Errorf("SLO scaling used %.3f GPU-hours, the fixed fleet %.3f", slo.GPUHours, fixed.GPUHours)
	}
	if len(slo.Events) < 2 || slo.PeakReplicas <= 2 {
		t.Errorf("SLO scaling did not scale up and down: events %v", slo.Events)
	}
	if !(gpu.GPUHours > 1.2*slo.GPUHours) {
		t.Errorf("GPU-utilisation scaling used %.3f GPU-hours, SLO scaling %.3f: not shown worse", gpu.GPUHours, slo.GPUHours)
	}
	if fixed.MeanReplicas != 4 || len(fixed.Events) != 0 {
		t.Errorf("fixed fleet: mean %v replicas, events %v", fixed.MeanReplicas, fixed.Events)
	}
}

func TestAutoscaleFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--autoscale", "cpu"}, "unknown scaling policy"},
		{[]string{"--autoscale", "slo", "--slo-ttft", "0s", "--slo-tpot", "0s"}, "needs --slo-ttft"},
		{[]string{"--autoscale", "queue", "--policies", "load,random"}, "exactly one routing policy"},
		{[]string{"--autoscale", "queue", "--autoscale-min", "5", "--autoscale-max", "2"}, "min ≤ max"},
	} {
		args := append(append([]string{}, steppedLoad...), c.args...)
		args = append(args, "--out", t.TempDir())
		var stderr bytes.Buffer
		err := Main(context.Background(), args, nil, &stderr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}
