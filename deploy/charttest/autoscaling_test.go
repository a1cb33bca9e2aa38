package charttest

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvgate/kvgate/autoscale"
)

// scaledObjects are the rendered ScaledObjects by target Deployment.
func scaledObjects(t *testing.T, objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetKind() == "ScaledObject" {
			out[str(t, o, "spec", "scaleTargetRef", "name")] = o
		}
	}
	return out
}

type trigger struct {
	Type       string            `json:"type"`
	Name       string            `json:"name"`
	MetricType string            `json:"metricType"`
	Metadata   map[string]string `json:"metadata"`
	AuthRef    *struct {
		Name string `json:"name"`
	} `json:"authenticationRef"`
}

func triggersOf(t *testing.T, o *unstructured.Unstructured) map[string]trigger {
	t.Helper()
	raw, _, _ := unstructured.NestedSlice(o.Object, "spec", "triggers")
	js, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	var ts []trigger
	if err := json.Unmarshal(js, &ts); err != nil {
		t.Fatal(err)
	}
	out := map[string]trigger{}
	for _, tr := range ts {
		out[tr.Name] = tr
	}
	return out
}

// behaviorOf reads the ScaledObject's HPA behaviour into the package's
// model, for comparison with the benchmark's policy of the same name.
func behaviorOf(t *testing.T, o *unstructured.Unstructured) autoscale.Behavior {
	t.Helper()
	raw, _, _ := unstructured.NestedMap(o.Object, "spec", "advanced", "horizontalPodAutoscalerConfig", "behavior")
	js, _ := json.Marshal(raw)
	type policy struct {
		Type          string `json:"type"`
		Value         int    `json:"value"`
		PeriodSeconds int    `json:"periodSeconds"`
	}
	type rules struct {
		Window   int      `json:"stabilizationWindowSeconds"`
		Select   string   `json:"selectPolicy"`
		Policies []policy `json:"policies"`
	}
	var b struct{ ScaleUp, ScaleDown rules }
	if err := json.Unmarshal(js, &b); err != nil {
		t.Fatal(err)
	}
	conv := func(r rules) autoscale.Rules {
		out := autoscale.Rules{StabilizationWindow: time.Duration(r.Window) * time.Second, Select: autoscale.Select(r.Select)}
		for _, p := range r.Policies {
			out.Policies = append(out.Policies, autoscale.RatePolicy{Type: autoscale.RatePolicyType(p.Type), Value: p.Value, Period: time.Duration(p.PeriodSeconds) * time.Second})
		}
		return out
	}
	return autoscale.Behavior{ScaleUp: conv(b.ScaleUp), ScaleDown: conv(b.ScaleDown)}
}

// TestRenderAutoscaling checks the ScaledObjects against llm-d's guides
// (trigger names, PromQL, thresholds) and against the policies `kvgate
// bench --autoscale` simulates (thresholds and HPA behaviours).
func TestRenderAutoscaling(t *testing.T) {
	objs := mustRender(t, "autoscaling-values.yaml")
	byDep := scaledObjects(t, objs)
	if len(byDep) != 8 {
		t.Fatalf("want 8 ScaledObjects, got %v", kinds(objs))
	}
	find(t, objs, "PrometheusRule")
	epp := `namespace="llm",service="kvgate-epp"`
	model := `model_name="Qwen/Qwen3-32B"`
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	want := map[string]struct {
		policy   string
		triggers map[string][2]string // name → query, threshold
	}{
		"vllm-queue": {"queue", map[string][2]string{
			"epp-queue-size":       {"sum(llm_d_epp_flow_control_queue_size{" + epp + "," + model + "})", f(autoscale.QueuePerReplica)},
			"epp-running-requests": {"sum(llm_d_epp_request_running{" + epp + "," + model + "})", f(autoscale.RunningPerReplica)},
		}},
		"vllm-saturation": {"saturation", map[string][2]string{
			"pool-saturation":      {`max(llm_d_epp_flow_control_pool_saturation{inference_pool="kvgate",namespace="llm"})`, f(autoscale.SaturationTarget)},
			"epp-running-requests": {"sum(llm_d_epp_request_running{" + epp + "," + model + "})", f(autoscale.RunningPerReplica)},
		}},
		"vllm-guard": {"queue-guard", map[string][2]string{
			"queue":    {"sum(llm_d_epp_flow_control_queue_size{" + epp + "," + model + "})", "1"},
			"running":  {"sum(llm_d_epp_request_running{" + epp + "," + model + "})", "16"},
			"pending":  {`max(kube_deployment_status_replicas_unavailable{namespace="llm",deployment="vllm-guard"})`, "1"},
			"replicas": {`max(kube_deployment_status_replicas{namespace="llm",deployment="vllm-guard"})`, "1"},
		}},
		"vllm-tokens": {"token-aware", map[string][2]string{
			"prefill-backlog-seconds": {`(sum(llm_d_epp_inflight_tokens{namespace="llm",producer_name="inflight-load-producer"}) / 15928) or vector(0)`, f(autoscale.PrefillBacklogTarget)},
			"decode-kv-utilization":   {`sum(vllm:kv_cache_usage_perc{namespace="llm"}) or vector(0)`, f(autoscale.KVTarget)},
		}},
		"vllm-prefill-guide": {"token-aware", map[string][2]string{
			"prefill-backlog-seconds": {`(sum(llm_d_epp_inflight_tokens{namespace="llm",producer_name="inflight-load-producer",endpoint_name=~".*prefill.*"}) / 33821) or vector(0)`, f(autoscale.PrefillBacklogTarget)},
		}},
		// Without a configured throughput: the picker's learned seconds,
		// selected by the endpoints' llm-d.ai/role.
		"vllm-prefill": {"token-aware", map[string][2]string{
			"prefill-backlog-seconds": {`sum(kvgate_endpoint_prefill_backlog_seconds{namespace="llm",name="kvgate",role="prefill"}) or vector(0)`, f(autoscale.PrefillBacklogTarget)},
		}},
		"vllm-decode": {"token-aware", map[string][2]string{
			"decode-kv-utilization": {`sum(vllm:kv_cache_usage_perc{namespace="llm",pod=~".*decode.*"}) or vector(0)`, f(autoscale.KVTarget)},
		}},
		"vllm-slo": {"slo", map[string][2]string{
			"saturation":    {`max(kvgate:slo_saturation{inference_pool="kvgate",namespace="llm"}) or vector(0)`, "1"},
			"replicas":      {`max(kube_deployment_status_replicas{namespace="llm",deployment="vllm-slo"})`, "1"},
			"readyReplicas": {`max(kube_deployment_status_replicas_ready{namespace="llm",deployment="vllm-slo"})`, "1"},
		}},
	}
	for dep, w := range want {
		o := byDep[dep]
		if o == nil {
			t.Errorf("no ScaledObject for %s", dep)
			continue
		}
		got := triggersOf(t, o)
		if len(got) != len(w.triggers) {
			t.Errorf("%s: triggers %v, want %v", dep, got, w.triggers)
		}
		for name, qt := range w.triggers {
			tr, ok := got[name]
			switch {
			case !ok:
				t.Errorf("%s: no trigger %s", dep, name)
			case tr.Type != "prometheus" || tr.MetricType != "AverageValue":
				t.Errorf("%s/%s: type %s metricType %s", dep, name, tr.Type, tr.MetricType)
			case tr.Metadata["query"] != qt[0] || tr.Metadata["threshold"] != qt[1]:
				t.Errorf("%s/%s:\n got %q threshold %s\nwant %q threshold %s", dep, name, tr.Metadata["query"], tr.Metadata["threshold"], qt[0], qt[1])
			case tr.AuthRef == nil || tr.AuthRef.Name != "prometheus-auth":
				t.Errorf("%s/%s: authenticationRef %v", dep, name, tr.AuthRef)
			}
		}
		wantB, _ := autoscale.PolicyBehavior(w.policy)
		if got := behaviorOf(t, o); !reflect.DeepEqual(normalize(got), normalize(wantB)) {
			t.Errorf("%s: behavior %+v, the %s policy's %+v", dep, got, w.policy, wantB)
		}
	}
	// The formulas: KEDA passes raw values, so the targets are in them.
	guard := str(t, byDep["vllm-guard"], "spec", "advanced", "scalingModifiers", "formula")
	if !strings.Contains(guard, "max(queue / 1, running / 16)") || !strings.Contains(guard, "pending ?? 0") {
		t.Errorf("queue-guard formula %q", guard)
	}
	slo := str(t, byDep["vllm-slo"], "spec", "advanced", "scalingModifiers", "formula")
	for _, s := range []string{fmt.Sprintf("saturation > %v", autoscale.SLOUp), fmt.Sprintf("saturation < %v", autoscale.SLODown), "readyReplicas / replicas", "ceil(", "floor("} {
		if !strings.Contains(slo, s) {
			t.Errorf("slo formula %q lacks %q", slo, s)
		}
	}
	if got := str(t, byDep["vllm-slo"], "spec", "minReplicaCount"); got != "3" {
		t.Errorf("slo minReplicaCount %s", got)
	}
	rule := find(t, objs, "PrometheusRule")
	if got := rule.GetLabels()["release"]; got != "kube-prometheus-stack" {
		t.Errorf("rule labels %v", rule.GetLabels())
	}
}

// normalize fills the HPA's default selectPolicy so that equal behaviours
// compare equal.
func normalize(b autoscale.Behavior) autoscale.Behavior {
	for _, r := range []*autoscale.Rules{&b.ScaleUp, &b.ScaleDown} {
		if r.Select == "" {
			r.Select = autoscale.SelectMax
		}
	}
	return b
}

func TestRenderAutoscalingRejects(t *testing.T) {
	base := []string{"autoscaling.enabled=true", "autoscaling.modelName=m"}
	tests := []struct {
		name string
		sets []string
		want string
	}{
		{"unknown policy", []string{"autoscaling.targets[0].deployment=a", "autoscaling.targets[0].policy=cpu"}, "policy"},
		{"twice", []string{"autoscaling.targets[0].deployment=a", "autoscaling.targets[0].policy=queue", "autoscaling.targets[1].deployment=a", "autoscaling.targets[1].policy=slo"}, "listed twice"},
		{"role outside token-aware", []string{"autoscaling.targets[0].deployment=a", "autoscaling.targets[0].policy=queue", "autoscaling.targets[0].role=prefill"}, "token-aware only"},
		{"throughput on a decode target", []string{"autoscaling.targets[0].deployment=a", "autoscaling.targets[0].policy=token-aware", "autoscaling.targets[0].role=decode", "autoscaling.targets[0].peakPrefillThroughput=1000"}, "peakPrefillThroughput"},
		{"throughput outside token-aware", []string{"autoscaling.targets[0].deployment=a", "autoscaling.targets[0].policy=slo", "autoscaling.targets[0].peakPrefillThroughput=1000"}, "peakPrefillThroughput"},
		{"max below min", []string{"autoscaling.targets[0].deployment=a", "autoscaling.targets[0].policy=queue", "autoscaling.targets[0].minReplicas=4", "autoscaling.targets[0].maxReplicas=2"}, "below minReplicas"},
		{"slo without rules", []string{"autoscaling.targets[0].deployment=a", "autoscaling.targets[0].policy=slo", "autoscaling.rules.create=false"}, "rules.create"},
		// --set-json: --set reads 0.3 as a string.
		{"band inverted", []string{"autoscaling.targets[0].deployment=a", "autoscaling.targets[0].policy=slo", "json:autoscaling.targets[0].thresholds.sloUp=0.3"}, "sloUp must exceed"},
		{"unknown threshold", []string{"autoscaling.targets[0].deployment=a", "autoscaling.targets[0].policy=queue", "autoscaling.targets[0].thresholds.gpu=1"}, "gpu"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			for _, s := range append(append([]string{}, base...), tc.sets...) {
				if v, ok := strings.CutPrefix(s, "json:"); ok {
					args = append(args, "--set-json", v)
				} else {
					args = append(args, "--set", s)
				}
			}
			_, err := renderArgs(t, "default-values.yaml", args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	_, err := render(t, "default-values.yaml", "autoscaling.enabled=true", "autoscaling.targets[0].deployment=a", "autoscaling.targets[0].policy=queue")
	if err == nil || !strings.Contains(err.Error(), "modelName is required") {
		t.Errorf("queue without modelName: %v", err)
	}
	// Off by default, and with nothing to scale.
	for _, sets := range [][]string{nil, {"autoscaling.enabled=true"}} {
		for _, o := range mustRender(t, "default-values.yaml", sets...) {
			if k := o.GetKind(); k == "ScaledObject" || k == "PrometheusRule" {
				t.Errorf("%v rendered a %s", sets, k)
			}
		}
	}
}

// TestDryRunAutoscalingCatchesErrors shows the KEDA and Prometheus
// Operator schemas are in force: broken objects are refused.
func TestDryRunAutoscalingCatchesErrors(t *testing.T) {
	c := adminClient(t)
	ensureNamespace(t, c, releaseNamespace)
	objs := mustRender(t, "autoscaling-values.yaml")
	for _, tc := range []struct {
		kind  string
		path  []string
		value any
	}{
		{"ScaledObject", []string{"spec", "triggers"}, "not-a-list"},
		{"ScaledObject", []string{"spec", "scaleTargetRef", "name"}, int64(3)},
		{"PrometheusRule", []string{"spec", "groups"}, "not-a-list"},
	} {
		t.Run(tc.kind+"/"+strings.Join(tc.path, "."), func(t *testing.T) {
			o := find(t, objs, tc.kind).DeepCopy()
			if crd := crdFor(o.GroupVersionKind()); !crdFiles[crd] {
				t.Skipf("CRD %s not installed: run scripts/envtest.sh", crd)
			}
			if err := c.Create(context.Background(), o, client.DryRunAll); err != nil {
				t.Fatalf("the unbroken %s is refused: %v", tc.kind, err)
			}
			if err := unstructured.SetNestedField(o.Object, tc.value, tc.path...); err != nil {
				t.Fatal(err)
			}
			if err := c.Create(context.Background(), o, client.DryRunAll); err == nil {
				t.Fatalf("broken %s accepted", tc.kind)
			}
		})
	}
}
