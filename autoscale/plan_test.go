package autoscale

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/sim/engine"
)

func preset(t *testing.T, name string) engine.Preset {
	t.Helper()
	p, ok := engine.LookupPreset(name)
	if !ok {
		t.Fatalf("no preset %s", name)
	}
	return p
}

func planner(t *testing.T, seed uint64) *Planner {
	t.Helper()
	sp := workload.SharedPrefix{Groups: 1, SuffixTokens: 4000, OutputTokens: 100,
		Stages: []workload.Stage{{QPS: 6, Duration: 90 * time.Second}}}
	reqs, err := sp.Generate(seed)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := config.Policy(config.PolicyLoad, config.PolicyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &Planner{
		Variants: []Variant{
			{Name: "h100", Accelerator: "H100", Cost: 8, Preset: preset(t, "qwen3-32b-tp2-h100"), Max: 6},
			{Name: "h200", Accelerator: "H200", Cost: 9, Preset: preset(t, "qwen3-32b-tp2-h200"), Max: 6},
		},
		SLO:      SLOTarget{TTFT: time.Second, TPOT: 50 * time.Millisecond, Attainment: 0.95},
		Requests: reqs, Routing: cluster.Policy{Name: config.PolicyLoad, Config: raw}, Seed: seed,
	}
}

// TestPlanner checks plans in the simulation. One planner per load serves
// every subtest: simulated evaluations are memoised, so each fleet is
// simulated once.
//   - IsTight: the plan meets the SLO target, and one replica fewer of any
//     variant it uses does not.
//   - MixesVariants: a load whose cheapest answer is heterogeneous.
//   - OnLatencyModel: the plan made on the picker's latency model against
//     the simulation's (model_test.go).
func TestPlanner(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a few dozen fleets")
	}
	prefillBound, decodeHeavy := planner(t, 1), mixedPlanner(t)
	t.Run("IsTight", func(t *testing.T) { checkTight(t, prefillBound, mustPlan(t, prefillBound)) })
	t.Run("MixesVariants", func(t *testing.T) { planMixesVariants(t, decodeHeavy) })
	t.Run("OnLatencyModel", func(t *testing.T) { planOnLatencyModel(t, prefillBound, decodeHeavy) })
}

// planMixesVariants: decode-heavy requests under a tight TPOT objective,
// where an H200's memory bandwidth carries more than an H100 for 9/8 of its
// price, and whole replicas of either alone overshoot. The mix uses both
// variants, is tight in the simulation, and is cheaper than either variant
// alone.
func planMixesVariants(t *testing.T, p *Planner) {
	plan := mustPlan(t, p)
	used := 0
	for _, n := range plan.Best.Mix {
		if n > 0 {
			used++
		}
	}
	if used < 2 {
		t.Fatalf("plan %v uses one variant (alone %v): the load no longer needs a mix", plan.Best.Mix, plan.Alone)
	}
	checkTight(t, p, plan)
}

func mustPlan(t *testing.T, p *Planner) *Plan {
	t.Helper()
	plan, err := p.Plan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	best := plan.Best
	t.Logf("plan %v: cost %.0f/h, met %.1f%%, alone %v, %d mixes simulated", best.Mix, best.Mix.Cost(p.Variants), 100*best.Met, plan.Alone, plan.Simulated)
	return plan
}

// checkTight re-simulates around the plan: it meets the target, one
// replica fewer of any variant it uses does not, and no variant alone is
// cheaper at its own smallest fleet.
func checkTight(t *testing.T, p *Planner, plan *Plan) {
	t.Helper()
	best := plan.Best
	if !p.Meets(best) || best.Mix.Replicas() == 0 {
		t.Fatalf("plan %v meets %.1f%%", best.Mix, 100*best.Met)
	}
	for i, n := range best.Mix {
		if n == 0 {
			continue
		}
		fewer := slices.Clone(best.Mix)
		fewer[i]--
		e, err := p.Evaluate(context.Background(), fewer)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("one %s fewer (%v): %.1f%% met", p.Variants[i].Name, fewer, 100*e.Met)
		if p.Meets(e) {
			t.Errorf("one %s fewer (%v) still meets the target: %.1f%%", p.Variants[i].Name, fewer, 100*e.Met)
		}
	}
	for i, n := range plan.Alone {
		if n > 0 && float64(n)*p.Variants[i].Cost < best.Mix.Cost(p.Variants) {
			t.Errorf("%d × %s alone meets it for less", n, p.Variants[i].Name)
		}
	}
}

func TestPlanRejects(t *testing.T) {
	p := planner(t, 1)
	p.Variants[1].Preset = preset(t, "llama-3.1-8b-h100")
	if _, err := p.Plan(context.Background()); err == nil || !strings.Contains(err.Error(), "one model") {
		t.Errorf("two models: %v", err)
	}
	p = planner(t, 1)
	p.Variants[0].Cost = 0
	if _, err := p.Plan(context.Background()); err == nil {
		t.Error("zero cost accepted")
	}
	p = planner(t, 1)
	p.SLO = SLOTarget{Attainment: 0.9}
	if _, err := p.Plan(context.Background()); err == nil {
		t.Error("no objective accepted")
	}
}

// TestPlanMainMetrics runs the command and reads its wva_* metrics back.
func TestPlanMainMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates fleets")
	}
	path := filepath.Join(t.TempDir(), "wva.prom")
	var stdout, stderr bytes.Buffer
	err := PlanMain(context.Background(), []string{
		"--variant", "name=h200,preset=qwen3-32b-tp2-h200,cost=9,accelerator=H200,max=4",
		"--rate", "3", "--duration", "60s", "--prompt-tokens", "2000", "--output-tokens", "50",
		"--slo-ttft", "1s", "--namespace", "llm-d", "--current", "h200=4", "--metrics-out", path,
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var out PlanOutput
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Variants) != 1 || out.Variants[0].Desired < 1 || out.Met < 0.95 {
		t.Fatalf("plan %+v", out)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tp := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := tp.TextToMetricFamilies(f)
	if err != nil {
		t.Fatal(err)
	}
	d := mfs["wva_desired_replicas"]
	if d == nil || len(d.Metric) != 1 || d.Metric[0].GetGauge().GetValue() != float64(out.Variants[0].Desired) {
		t.Fatalf("wva_desired_replicas: %v", d)
	}
	want := map[string]string{"variant_name": "h200", "namespace": "llm-d", "accelerator_type": "H200"}
	for _, l := range d.Metric[0].Label {
		if want[l.GetName()] != l.GetValue() {
			t.Errorf("label %s=%s", l.GetName(), l.GetValue())
		}
	}
	for _, n := range []string{"wva_current_replicas", "wva_desired_ratio"} {
		if mfs[n] == nil {
			t.Errorf("%s missing", n)
		}
	}
}

func TestPlanMainUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--rate", "1"},
		{"--variant", "name=a,preset=nope,cost=1", "--rate", "1"},
		{"--variant", "name=a,preset=qwen3-32b-tp2-h100,cost=1", "--rate", "1", "--trace", "x"},
		{"--variant", "name=a,preset=qwen3-32b-tp2-h100,cost=1", "--rate", "1", "--current", "b=2"},
		{"--variant", "name=a,preset=qwen3-32b-tp2-h100,cost=1,gpus=2", "--rate", "1"},
	} {
		var stderr bytes.Buffer
		if err := PlanMain(context.Background(), args, &bytes.Buffer{}, &stderr); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestPlanMainLatencyModel runs `kvgate plan --latency-model`: the model
// is fitted on the current fleet (or, without one, on the calibration
// ramp), its answer checked in the simulation, and the output says both.
func TestPlanMainLatencyModel(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates fleets")
	}
	for _, tc := range []struct {
		current []string
		calib   string
	}{
		{[]string{"--current", "h200=2"}, "2 × h200"},
		{nil, "ramp"},
	} {
		var stdout, stderr bytes.Buffer
		err := PlanMain(context.Background(), append([]string{
			"--variant", "name=h200,preset=qwen3-32b-tp2-h200,cost=9,accelerator=H200,max=4",
			"--rate", "3", "--duration", "60s", "--prompt-tokens", "2000", "--output-tokens", "50",
			"--slo-ttft", "1s", "--latency-model",
		}, tc.current...), &stdout, &stderr)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr.String())
		}
		t.Log(stderr.String())
		var out PlanOutput
		if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		lm := out.LatencyModel
		if lm == nil || len(lm.Learned) != 1 || lm.Learned[0].Preset != "qwen3-32b-tp2-h200" || !(lm.Learned[0].PrefillTokensPerSecond > 0) {
			t.Fatalf("latency model output %+v", lm)
		}
		if !strings.Contains(lm.Calibration, tc.calib) {
			t.Errorf("calibration %q, want %q", lm.Calibration, tc.calib)
		}
		if out.Met < 0.95 || len(out.Variants) != 1 {
			t.Fatalf("plan %+v", out)
		}
		if lm.Agree != (lm.MetSimulated >= 0.95) {
			t.Errorf("agree %v with %.3f simulated", lm.Agree, lm.MetSimulated)
		}
		if lm.Agree && (lm.Desired["h200"] != out.Variants[0].Desired || lm.MetSimulated != out.Met) {
			t.Errorf("agreeing plans differ: model %+v, final %+v", lm, out)
		}
	}
}

// The calibration ramp keeps the offered requests' shapes with the rate
// rising linearly from zero to the offered rate: half the requests, a
// quarter of them in the first half of the time.
func TestCalibrationRamps(t *testing.T) {
	p := &Planner{}
	for i := range 600 {
		p.Requests = append(p.Requests, workload.Request{Arrival: time.Duration(i) * 100 * time.Millisecond, OutputTokens: i})
	}
	cal := p.Calibration()
	early := 0
	for i, r := range cal {
		if r.OutputTokens != i || r.Arrival > time.Minute || (i > 0 && r.Arrival < cal[i-1].Arrival) {
			t.Fatalf("request %d: %+v", i, r)
		}
		if r.Arrival < 30*time.Second {
			early++
		}
	}
	if len(cal) < 295 || len(cal) > 305 || early < 70 || early > 80 {
		t.Errorf("%d requests, %d in the first half", len(cal), early)
	}
}
