package charttest

import (
	"context"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvgate/kvgate/agent"
	"github.com/kvgate/kvgate/extproc/epp"
)

// The node agent's DaemonSet: GPU nodes, host network and PID namespace,
// the eBPF capabilities and not privileged, the mounts eBPF and the KV
// regions need, the NVIDIA runtime; the picker subscribes to exactly its
// pods; the dashboards become sidecar-labelled ConfigMaps.
func TestRenderAgent(t *testing.T) {
	objs := mustRender(t, "agent-values.yaml")
	ds := find(t, objs, "DaemonSet")
	spec := func(path ...string) string {
		return str(t, ds, append([]string{"spec", "template", "spec"}, path...)...)
	}
	for _, c := range []struct{ path, want string }{
		{"hostNetwork", "true"}, {"hostPID", "true"}, {"runtimeClassName", "nvidia"},
		{"automountServiceAccountToken", "false"}, {"nodeSelector", "map[nvidia.com/gpu.present:true]"},
	} {
		if got := spec(c.path); got != c.want {
			t.Errorf("%s = %s, want %s", c.path, got, c.want)
		}
	}
	if got := spec("tolerations"); !strings.Contains(got, "key:nvidia.com/gpu") {
		t.Errorf("tolerations = %s", got)
	}
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%d containers", len(cs))
	}
	c := cs[0].(map[string]any)
	sc := c["securityContext"].(map[string]any)
	if sc["privileged"] != false || sc["allowPrivilegeEscalation"] != false {
		t.Errorf("securityContext %v", sc)
	}
	caps := sc["capabilities"].(map[string]any)
	if add := caps["add"].([]any); !slices.Equal(add, []any{"BPF", "PERFMON", "NET_ADMIN"}) || !slices.Equal(caps["drop"].([]any), []any{"ALL"}) {
		t.Errorf("capabilities %v", caps)
	}
	mounts := map[string]string{}
	for _, m := range c["volumeMounts"].([]any) {
		m := m.(map[string]any)
		mounts[m["mountPath"].(string)] = m["name"].(string)
	}
	for _, p := range []string{"/sys/fs/cgroup", "/sys/kernel/btf", "/sys/fs/bpf", "/dev/shm"} {
		if mounts[p] == "" {
			t.Errorf("no mount at %s: %v", p, mounts)
		}
	}

	// The agent's arguments are kvgate-agent's flags: with the node's IP
	// for $(HOST_IP) it parses them all and stops at the --gpu value
	// appended here, which it checks after binding.
	var args []string
	for _, a := range c["args"].([]any) {
		a := strings.ReplaceAll(a.(string), "$(HOST_IP)", "127.0.0.1")
		a = strings.ReplaceAll(a, "$(NODE_NAME)", "node-a")
		a = strings.Replace(a, ":7600", ":0", 1)
		args = append(args, strings.Replace(a, ":9400", ":0", 1))
	}
	err := agent.Main(context.Background(), append(args, "--gpu=probe"), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `--gpu "probe"`) {
		t.Errorf("kvgate-agent %v: %v", args, err)
	}

	// The picker's selector picks the DaemonSet's pods, and only them.
	pargs := containerArgs(t, objs)
	if _, err := epp.ParseFlags(pargs, io.Discard); err != nil {
		t.Fatalf("picker args %v: %v", pargs, err)
	}
	var sel string
	for _, a := range pargs {
		if v, ok := strings.CutPrefix(a, "--telemetry-agent-selector="); ok {
			sel = v
		}
	}
	s, err := labels.Parse(sel)
	if err != nil || sel == "" {
		t.Fatalf("--telemetry-agent-selector %q: %v", sel, err)
	}
	podLabels, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "labels")
	if !s.Matches(labels.Set(podLabels)) {
		t.Errorf("selector %s misses the agent pods %v", sel, podLabels)
	}
	pickerLabels, _, _ := unstructured.NestedStringMap(find(t, objs, "Deployment").Object, "spec", "template", "metadata", "labels")
	if s.Matches(labels.Set(pickerLabels)) {
		t.Errorf("selector %s matches the picker's pods", sel)
	}

	var monitors, dashboards int
	for _, o := range objs {
		switch {
		case o.GetKind() == "ServiceMonitor" && strings.HasSuffix(o.GetName(), "-agent-monitor"):
			monitors++
			if got := str(t, o, "spec", "selector", "matchLabels"); !strings.Contains(got, "component:node-agent") {
				t.Errorf("agent ServiceMonitor selects %s", got)
			}
		case o.GetKind() == "ConfigMap" && o.GetLabels()["grafana_dashboard"] == "1":
			dashboards++
			if o.GetAnnotations()["grafana_folder"] != "kvgate" {
				t.Errorf("dashboard annotations %v", o.GetAnnotations())
			}
			for name, v := range o.Object["data"].(map[string]any) {
				var d struct{ Title string }
				if err := json.Unmarshal([]byte(v.(string)), &d); err != nil || d.Title == "" {
					t.Errorf("dashboard %s: %v", name, err)
				}
			}
		}
	}
	if monitors != 1 || dashboards == 0 {
		t.Errorf("%d agent ServiceMonitors, %d dashboard ConfigMaps", monitors, dashboards)
	}
}

// Off by default: no agent objects, no telemetry flags on the picker.
func TestAgentOffByDefault(t *testing.T) {
	objs := mustRender(t, "default-values.yaml")
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" || strings.Contains(o.GetName(), "-agent") || strings.Contains(o.GetName(), "dashboard") {
			t.Errorf("rendered %s %s", o.GetKind(), o.GetName())
		}
	}
	for _, a := range containerArgs(t, objs) {
		if strings.HasPrefix(a, "--telemetry") {
			t.Errorf("picker arg %s", a)
		}
	}
	// The picker without the DaemonSet's telemetry.
	objs = mustRender(t, "agent-values.yaml", "agent.pickerTelemetry=false")
	for _, a := range containerArgs(t, objs) {
		if strings.HasPrefix(a, "--telemetry") {
			t.Errorf("picker arg %s with pickerTelemetry=false", a)
		}
	}
}

func TestRenderRejectsAgent(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		want string
	}{
		{[]string{"agent.enabled=true", "agent.capabilities={cap_bpf}"}, "capabilities"},
		{[]string{"agent.enabled=true", "agent.hostPaths.btf=sys/kernel/btf"}, "btf"},
		{[]string{"agent.enabled=true", "agent.metricsPort=7600"}, "must differ"},
		{[]string{"agent.privileged=true"}, "privileged"},
		{[]string{"dashboards.label="}, "label"},
	} {
		t.Run(strings.Join(tc.sets, " "), func(t *testing.T) {
			_, err := render(t, "default-values.yaml", tc.sets...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
