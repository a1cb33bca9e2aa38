package dashboards

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/autoscale"
	"github.com/kvgate/kvgate/extproc/endpoints/k8s/k8stest"
	"github.com/kvgate/kvgate/internal/testutil"
)

// renderAutoscaling renders the chart's autoscaling objects for the test
// fleet: its namespace, picker service, pool and model.
func renderAutoscaling(t *testing.T, f *fleet) []*unstructured.Unstructured {
	t.Helper()
	chart := filepath.Join(testutil.RepoRoot(t), "deploy", "helm", "kvgate")
	cmd := exec.Command(k8stest.Helm(t), "template", "kvgate", chart, "--namespace", testNamespace, "--kube-version", "1.37.2",
		"--values", filepath.Join(chart, "ci", "autoscaling-values.yaml"),
		"--set", "autoscaling.eppService="+eppService, "--set", "autoscaling.inferencePool="+f.poolName,
		"--set", "autoscaling.modelName="+fleetModel,
		// Rules evaluated every second, so that a short load yields a
		// smoothed signal.
		"--set", "autoscaling.slo.evaluationInterval=1s")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v: %s", err, stderr.String())
	}
	all, err := k8stest.DecodeObjects(out)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	for _, o := range all {
		if k := o.GetKind(); k == "ScaledObject" || k == "PrometheusRule" {
			objs = append(objs, o)
		}
	}
	return objs
}

// TestAutoscalingQueriesOnLiveFleet evaluates what the chart's scaling
// objects read with a real Prometheus scraping a kvgate fleet under load:
// the PrometheusRule's recording rules loaded as Prometheus rule files,
// then every ScaledObject trigger's query. The fleet has a server of each
// P/D role (llm-d.ai/role prefill and decode, named as llm-d's pods are)
// beside an unlabelled one, and kube-state-metrics reports the scaled
// Deployments from a real kube-apiserver, so every query returns data.
// Without the envtest binaries (and not required) the kube_* queries are
// explained instead. The variant planner's measured demand is read from
// the same server.
func TestAutoscalingQueriesOnLiveFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet and prometheus; skipped with -short")
	}
	bin := prometheusBinary(t)
	ksm := kubeStateMetricsBinary(t)
	f := startFleetWith(t, testutil.TokenizerDir(t), 3, 0, []string{"", "prefill", "decode"})
	objs := renderAutoscaling(t, f)

	var ruleFiles []string
	var triggers []Panel
	var deployments []string
	for _, o := range objs {
		switch o.GetKind() {
		case "PrometheusRule":
			groups, _, _ := unstructured.NestedSlice(o.Object, "spec", "groups")
			js, err := yaml.Marshal(map[string]any{"groups": groups})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "rules.yaml")
			if err := os.WriteFile(path, js, 0o644); err != nil {
				t.Fatal(err)
			}
			ruleFiles = append(ruleFiles, path)
		case "ScaledObject":
			dep, _, _ := unstructured.NestedString(o.Object, "spec", "scaleTargetRef", "name")
			deployments = append(deployments, dep)
			ts, _, _ := unstructured.NestedSlice(o.Object, "spec", "triggers")
			for _, tr := range ts {
				m := tr.(map[string]any)
				md := m["metadata"].(map[string]any)
				triggers = append(triggers, Panel{Dashboard: o.GetName(), Title: fmt.Sprint(m["name"]), Exprs: []string{fmt.Sprint(md["query"])}})
			}
		}
	}
	if len(ruleFiles) != 1 || len(triggers) < 10 {
		t.Fatalf("rendered %d rule files and %d triggers", len(ruleFiles), len(triggers))
	}
	targets := f.targets()
	if ksm != "" {
		targets = append(targets, startKubeStateMetrics(t, ksm, deployments))
	}
	prom := startPrometheus(t, bin, targets, ruleFiles...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := prom.awaitHealthy(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Counted, with a generous time bound: a loaded machine (-race, other
	// packages) is slow, and the signals only need some traffic.
	res := f.load(ctx, 4, 80, 5*time.Second, time.Minute, 0)
	if res.status[200] < 20 {
		t.Fatalf("load: %v (%v)", res.status, res.sample)
	}
	// Two rule evaluations and scrapes after the load.
	if err := prom.awaitHealthy(ctx, time.Now().Add(2500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	names, err := prom.metricNames(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The recording rules' outputs: the SLO-saturation signal is there and
	// positive while traffic flows.
	for _, q := range []string{
		`kvgate:slo_ttft_p90_seconds{namespace="` + testNamespace + `"} > 0`,
		`kvgate:slo_tpot_p90_seconds{namespace="` + testNamespace + `"} > 0`,
		`kvgate:slo_saturation:raw > 0`,
		`kvgate:slo_saturation{inference_pool="` + f.poolName + `",namespace="` + testNamespace + `"} > 0`,
	} {
		if r, err := prom.query(ctx, q); err != nil || r.Valued != 1 {
			t.Errorf("%s: %+v, %v\n%s", q, r, err, prom.log.String())
		}
	}
	withData := 0
	for _, p := range triggers {
		q := trivialFallback.ReplaceAllString(p.Exprs[0], "")
		r, err := prom.query(ctx, q)
		if err != nil {
			t.Errorf("%s/%s: %v: %s", p.Dashboard, p.Title, err, q)
			continue
		}
		if r.Valued > 0 {
			withData++
			continue
		}
		var absent []string
		for _, n := range MetricNames(q) {
			if !names[n] {
				absent = append(absent, n)
			}
		}
		if why := explain(q, absent); why != "" && ksm == "" {
			t.Logf("%s/%s empty: %s", p.Dashboard, p.Title, why)
			continue
		}
		t.Errorf("%s/%s returns nothing (absent %v): %s", p.Dashboard, p.Title, absent, q)
	}
	t.Logf("%d of %d trigger queries return data", withData, len(triggers))

	// kube-state-metrics read the Deployments' status from the API server:
	// the values the queue-guard and SLO formulas get.
	if ksm != "" {
		for _, q := range []string{
			`max(kube_deployment_status_replicas_unavailable{namespace="` + testNamespace + `",deployment="vllm-guard"}) == 1`,
			`max(kube_deployment_status_replicas{namespace="` + testNamespace + `",deployment="vllm-slo"}) == 3`,
			`max(kube_deployment_status_replicas_ready{namespace="` + testNamespace + `",deployment="vllm-slo"}) == 2`,
		} {
			if r, err := prom.query(ctx, q); err != nil || r.Valued != 1 {
				t.Errorf("%s: %+v, %v", q, r, err)
			}
		}
	}

	// The learned prefill backlog is there per endpoint with its role, in
	// seconds at the speed the picker learned (the unit test checks the
	// arithmetic): the P/D server's series is what the role-selected
	// trigger sums.
	for _, q := range []string{
		`kvgate_endpoint_prefill_backlog_seconds{role="prefill",endpoint="vllm-prefill-1"}`,
		`kvgate_endpoint_prefill_backlog_seconds{role="decode",endpoint="vllm-decode-2"}`,
		`kvgate_endpoint_prefill_backlog_seconds{role="",endpoint="vllm-0"}`,
	} {
		if r, err := prom.query(ctx, q); err != nil || r.Valued != 1 {
			t.Errorf("%s: %+v, %v", q, r, err)
		}
	}
	if r, err := prom.query(ctx, `max_over_time(kvgate_endpoint_prefill_backlog_seconds[5m]) > 0`); err == nil {
		t.Logf("endpoints whose learned prefill backlog was seen above 0 s: %d", r.Valued)
	}

	d, err := autoscale.MeasuredDemand(ctx, http.DefaultClient, prom.url, time.Minute, `{namespace="`+testNamespace+`"}`)
	if err != nil {
		t.Fatalf("measured demand: %v", err)
	}
	if d.Rate <= 0 || d.PromptTokens < 5 || d.OutputTokens < 1 {
		t.Errorf("measured demand %+v", d)
	}
	t.Logf("measured demand: %+v", d)
}
