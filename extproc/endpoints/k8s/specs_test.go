package k8s

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

func pod(name, ip string, ready bool, lbls map[string]string) corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: lbls},
		Status: corev1.PodStatus{
			PodIP:      ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}},
		},
	}
}

func TestSpecsFor(t *testing.T) {
	lbl := map[string]string{"app": "vllm", "llm-d.ai/role": "decode"}
	terminating := pod("c", "10.0.0.3", true, nil)
	terminating.DeletionTimestamp = &metav1.Time{}
	noCondition := pod("d", "10.0.0.4", true, nil)
	noCondition.Status.Conditions = nil

	tests := []struct {
		name      string
		pods      []corev1.Pod
		ports     []int
		want      []endpoints.Spec
		wantSkips []string
	}{
		{
			name:  "ready pods only, sorted by name",
			pods:  []corev1.Pod{pod("b", "10.0.0.2", true, lbl), pod("a", "10.0.0.1", true, nil), pod("x", "10.0.0.9", false, nil)},
			ports: []int{8000},
			want: []endpoints.Spec{
				{Name: "a", Address: "10.0.0.1:8000"},
				{Name: "b", Address: "10.0.0.2:8000", Labels: lbl},
			},
		},
		{
			name:  "terminating, IP-less and condition-less pods are left out",
			pods:  []corev1.Pod{terminating, pod("e", "", true, nil), noCondition},
			ports: []int{8000},
			want:  []endpoints.Spec{},
		},
		{
			name:  "several ports give one rank each",
			pods:  []corev1.Pod{pod("p", "10.0.0.1", true, lbl)},
			ports: []int{8000, 8001, 8002},
			want: []endpoints.Spec{
				{Name: "p-rank-0", Address: "10.0.0.1:8000", Labels: lbl, DataParallel: &endpoints.DataParallelRank{Server: "p", Rank: 0}},
				{Name: "p-rank-1", Address: "10.0.0.1:8001", Labels: lbl, DataParallel: &endpoints.DataParallelRank{Server: "p", Rank: 1}},
				{Name: "p-rank-2", Address: "10.0.0.1:8002", Labels: lbl, DataParallel: &endpoints.DataParallelRank{Server: "p", Rank: 2}},
			},
		},
		{
			name:  "a one-port pod named like a rank is no rank",
			pods:  []corev1.Pod{pod("vllm-rank-1", "10.0.0.1", true, nil)},
			ports: []int{8000},
			want:  []endpoints.Spec{{Name: "vllm-rank-1", Address: "10.0.0.1:8000"}},
		},
		{
			name:  "IPv6 addresses are bracketed",
			pods:  []corev1.Pod{pod("v6", "fd00::1", true, nil)},
			ports: []int{8000},
			want:  []endpoints.Spec{{Name: "v6", Address: "[fd00::1]:8000"}},
		},
		{
			name:      "an unparsable IP is reported",
			pods:      []corev1.Pod{pod("bad", "10.0.0", true, nil)},
			ports:     []int{8000},
			want:      []endpoints.Spec{},
			wantSkips: []string{"bad"},
		},
		{
			name:      "a shared IP stays with the first pod by name",
			pods:      []corev1.Pod{pod("z", "10.0.0.1", true, nil), pod("y", "10.0.0.1", true, nil)},
			ports:     []int{8000},
			want:      []endpoints.Spec{{Name: "y", Address: "10.0.0.1:8000"}},
			wantSkips: []string{"z"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, skips := specsFor(tc.pods, tc.ports)
			if !sameSpecs(got, tc.want) {
				t.Errorf("specs = %+v, want %+v", got, tc.want)
			}
			var names []string
			for _, s := range skips {
				names = append(names, s.pod)
			}
			if !reflect.DeepEqual(names, tc.wantSkips) {
				t.Errorf("skipped = %v, want %v", names, tc.wantSkips)
			}
			if err := endpoints.Validate(got); err != nil {
				t.Errorf("the datastore would reject the set: %v", err)
			}
		})
	}
}

// The node's address comes along (for node-level exporters), also
// through the cache's trimmed pods.
func TestSpecsForNodeAddress(t *testing.T) {
	p := pod("a", "10.0.0.1", true, nil)
	p.Status.HostIP = "192.168.0.7"
	trimmed, err := trimPod(&p)
	if err != nil {
		t.Fatal(err)
	}
	specs, _ := specsFor([]corev1.Pod{*trimmed.(*corev1.Pod)}, []int{8000, 8001})
	if len(specs) != 2 || specs[0].NodeAddress != "192.168.0.7" || specs[1].NodeAddress != "192.168.0.7" {
		t.Fatalf("specs %+v", specs)
	}
}

func TestSpecsForDetachesLabels(t *testing.T) {
	lbl := map[string]string{"app": "vllm"}
	specs, _ := specsFor([]corev1.Pod{pod("a", "10.0.0.1", true, lbl)}, []int{8000})
	specs[0].Labels["app"] = "changed"
	if lbl["app"] != "vllm" {
		t.Fatal("specs share the cached pod's label map")
	}
}

func TestPoolTarget(t *testing.T) {
	pool := func(match map[string]string, ports ...int) *inferencev1.InferencePool {
		p := &inferencev1.InferencePool{}
		if match != nil {
			p.Spec.Selector.MatchLabels = map[inferencev1.LabelKey]inferencev1.LabelValue{}
			for k, v := range match {
				p.Spec.Selector.MatchLabels[inferencev1.LabelKey(k)] = inferencev1.LabelValue(v)
			}
		}
		for _, n := range ports {
			p.Spec.TargetPorts = append(p.Spec.TargetPorts, inferencev1.Port{Number: inferencev1.PortNumber(n)})
		}
		return p
	}
	tests := []struct {
		name      string
		pool      *inferencev1.InferencePool
		wantSel   string
		wantPorts []int
		wantErr   string
	}{
		{name: "valid", pool: pool(map[string]string{"app": "vllm"}, 8000, 8001), wantSel: "app=vllm", wantPorts: []int{8000, 8001}},
		{name: "empty selector", pool: pool(nil, 8000), wantErr: "matchLabels is empty"},
		{name: "invalid label", pool: pool(map[string]string{"bad key!": "x"}, 8000), wantErr: "matchLabels"},
		{name: "no ports", pool: pool(map[string]string{"app": "vllm"}), wantErr: "at least one port"},
		{name: "repeated port", pool: pool(map[string]string{"app": "vllm"}, 8000, 8000), wantErr: "listed twice"},
		{name: "port zero", pool: pool(map[string]string{"app": "vllm"}, 0), wantErr: "out of range"},
		{name: "too many ports", pool: pool(map[string]string{"app": "vllm"}, 1, 2, 3, 4, 5, 6, 7, 8, 9), wantErr: "at most 8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := poolTarget(tc.pool)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.selector.String() != tc.wantSel || !reflect.DeepEqual(got.ports, tc.wantPorts) {
				t.Errorf("target = %v %v, want %v %v", got.selector, got.ports, tc.wantSel, tc.wantPorts)
			}
		})
	}
}

func TestTrimPod(t *testing.T) {
	full := pod("a", "10.0.0.1", true, map[string]string{"app": "vllm"})
	full.Annotations = map[string]string{"big": strings.Repeat("x", 1000)}
	full.Spec.Containers = []corev1.Container{{Name: "vllm", Image: "vllm"}}
	full.Status.Conditions = append(full.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue})
	obj, err := trimPod(&full)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := obj.(*corev1.Pod)
	if trimmed.Annotations != nil || len(trimmed.Spec.Containers) != 0 || len(trimmed.Status.Conditions) != 1 {
		t.Errorf("trimmed pod keeps unused fields: %+v", trimmed)
	}
	a, _ := specsFor([]corev1.Pod{full}, []int{8000})
	b, _ := specsFor([]corev1.Pod{*trimmed}, []int{8000})
	if !sameSpecs(a, b) {
		t.Errorf("trimming changed the endpoints: %v vs %v", a, b)
	}
	if other, _ := trimPod("not a pod"); other != "not a pod" {
		t.Error("non-pod objects must pass through unchanged")
	}
}
