package k8s_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/k8s"
	"github.com/kvgate/kvgate/extproc/endpoints/k8s/k8stest"
)

// waitLimit is a generous bound for a change to reach apply; it only stops
// a broken test from hanging. Latency is measured, not asserted (see
// BenchmarkReadyToRoutable).
const waitLimit = 10 * time.Second

var (
	suite k8stest.Suite
	// objectivesCRD is false when the InferenceObjective CRD is not
	// available here, which skips the priority test.
	objectivesCRD bool
	// llmdObjectivesCRD: the same for llm-d's group, llm-d.ai.
	llmdObjectivesCRD bool
	// rewritesCRD: InferenceModelRewrite's CRDs of both groups.
	rewritesCRD bool
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	k8s.RouteLogs(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	var extra []string
	if dir, err := k8stest.ExtraCRDDir(); err == nil {
		crd := filepath.Join(dir, "inferenceobjectives.yaml")
		if _, err := os.Stat(crd); err == nil {
			extra = append(extra, crd)
			objectivesCRD = true
		}
		crd = filepath.Join(dir, "llm-d.ai_inferenceobjectives.yaml")
		if _, err := os.Stat(crd); err == nil {
			extra = append(extra, crd)
			llmdObjectivesCRD = true
		}
		rewritesCRD = true
		for _, f := range []string{"inferencemodelrewrites.yaml", "llm-d.ai_inferencemodelrewrites.yaml"} {
			crd = filepath.Join(dir, f)
			if _, err := os.Stat(crd); err != nil {
				rewritesCRD = false
				continue
			}
			extra = append(extra, crd)
		}
	}
	return suite.Main(m, extra...)
}

// cluster is one test's namespace on the shared API server.
type cluster struct {
	t  testing.TB
	c  client.Client
	ns string
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, inferencev1.Install} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(suite.Env(t).Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return &cluster{t: t, c: c, ns: ns.Name}
}

func (k *cluster) createPool(name string, match map[string]string, ports ...int32) *inferencev1.InferencePool {
	k.t.Helper()
	p := &inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.ns}}
	setPool(p, match, ports...)
	if err := k.c.Create(context.Background(), p); err != nil {
		k.t.Fatal(err)
	}
	return p
}

func setPool(p *inferencev1.InferencePool, match map[string]string, ports ...int32) {
	p.Spec.Selector.MatchLabels = map[inferencev1.LabelKey]inferencev1.LabelValue{}
	for k, v := range match {
		p.Spec.Selector.MatchLabels[inferencev1.LabelKey(k)] = inferencev1.LabelValue(v)
	}
	p.Spec.TargetPorts = nil
	for _, n := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, inferencev1.Port{Number: inferencev1.PortNumber(n)})
	}
	p.Spec.EndpointPickerRef = &inferencev1.EndpointPickerRef{
		Name: "kvgate-epp",
		Port: &inferencev1.Port{Number: 9002},
	}
}

func (k *cluster) updatePool(name string, match map[string]string, ports ...int32) {
	k.t.Helper()
	var p inferencev1.InferencePool
	if err := k.c.Get(context.Background(), client.ObjectKey{Namespace: k.ns, Name: name}, &p); err != nil {
		k.t.Fatal(err)
	}
	setPool(&p, match, ports...)
	if err := k.c.Update(context.Background(), &p); err != nil {
		k.t.Fatal(err)
	}
}

func (k *cluster) createPod(name string, labels map[string]string, finalizers ...string) {
	k.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.ns, Labels: labels, Finalizers: finalizers},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	if err := k.c.Create(context.Background(), p); err != nil {
		k.t.Fatal(err)
	}
}

// setStatus plays the kubelet: envtest runs no nodes, so the test writes
// the pod's IP and Ready condition itself.
func (k *cluster) setStatus(name, ip string, ready bool) {
	k.t.Helper()
	k.modifyPod(name, func(p *corev1.Pod) {
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
	}, true)
}

func (k *cluster) relabel(name string, labels map[string]string) {
	k.t.Helper()
	k.modifyPod(name, func(p *corev1.Pod) { p.Labels = labels }, false)
}

func (k *cluster) modifyPod(name string, mutate func(*corev1.Pod), status bool) {
	k.t.Helper()
	var p corev1.Pod
	if err := k.c.Get(context.Background(), client.ObjectKey{Namespace: k.ns, Name: name}, &p); err != nil {
		k.t.Fatal(err)
	}
	mutate(&p)
	var err error
	if status {
		err = k.c.Status().Update(context.Background(), &p)
	} else {
		err = k.c.Update(context.Background(), &p)
	}
	if err != nil {
		k.t.Fatal(err)
	}
}

func (k *cluster) deleteObject(obj client.Object) {
	k.t.Helper()
	obj.SetNamespace(k.ns)
	if err := k.c.Delete(context.Background(), obj); err != nil && !apierrors.IsNotFound(err) {
		k.t.Fatal(err)
	}
}

// recorder is an apply function that keeps every set it was given.
type recorder struct {
	mu      sync.Mutex
	sets    [][]endpoints.Spec
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

func (r *recorder) apply(specs []endpoints.Spec) error {
	if err := endpoints.Validate(specs); err != nil {
		return err
	}
	r.mu.Lock()
	r.sets = append(r.sets, slices.Clone(specs))
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return nil
}

// history returns the sets applied since index from.
func (r *recorder) history(from int) [][]endpoints.Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sets[min(from, len(r.sets)):])
}

// waitFor waits until the latest applied set satisfies ok and returns its
// index in the history.
func (r *recorder) waitFor(t testing.TB, what string, ok func([]endpoints.Spec) bool) int {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		r.mu.Lock()
		n := len(r.sets)
		matched := n > 0 && ok(r.sets[n-1])
		var last []endpoints.Spec
		if n > 0 {
			last = r.sets[n-1]
		}
		r.mu.Unlock()
		if matched {
			return n - 1
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; last applied set: %v", what, names(last))
		}
	}
}

// exactly matches a set by its endpoint names and addresses.
func exactly(want ...string) func([]endpoints.Spec) bool {
	return func(specs []endpoints.Spec) bool { return slices.Equal(names(specs), want) }
}

// names renders a set as sorted "name=address" strings.
func names(specs []endpoints.Spec) []string {
	out := []string{}
	for _, s := range specs {
		out = append(out, s.Name+"="+s.Address)
	}
	slices.Sort(out)
	return out
}

// start runs discovery until the test ends.
func start(t testing.TB, opts k8s.Options, apply func([]endpoints.Spec) error) *k8s.Discovery {
	t.Helper()
	opts.RestConfig = suite.Env(t).Config
	d, err := k8s.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, apply) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return d
}

func TestPodLifecycle(t *testing.T) {
	k := newCluster(t)
	app := map[string]string{"app": "vllm", "llm-d.ai/role": "decode"}
	k.createPool("pool", map[string]string{"app": "vllm"}, 8000)
	k.createPod("a", app)
	k.createPod("b", app)
	k.createPod("term", app, "kvgate.test/hold")

	rec := newRecorder()
	start(t, k8s.Options{PoolName: "pool", PoolNamespace: k.ns}, rec.apply)
	rec.waitFor(t, "the initial empty set", exactly())

	began := time.Now()
	k.setStatus("a", "10.1.0.1", true)
	i := rec.waitFor(t, "a ready", exactly("a=10.1.0.1:8000"))
	t.Logf("pod ready -> applied: %v (includes the status write)", time.Since(began))
	if got := rec.history(i)[0][0].Labels["llm-d.ai/role"]; got != "decode" {
		t.Errorf("labels not carried: role = %q", got)
	}

	k.setStatus("b", "10.1.0.2", true)
	rec.waitFor(t, "b ready", exactly("a=10.1.0.1:8000", "b=10.1.0.2:8000"))

	k.setStatus("a", "10.1.0.1", false)
	rec.waitFor(t, "a unready", exactly("b=10.1.0.2:8000"))

	k.relabel("b", map[string]string{"app": "other"})
	rec.waitFor(t, "b relabelled out", exactly())
	k.relabel("b", app)
	rec.waitFor(t, "b relabelled in", exactly("b=10.1.0.2:8000"))

	// A terminating pod leaves the set as soon as its deletion starts, even
	// though it still exists (held by a finalizer) and still reports Ready.
	k.setStatus("term", "10.1.0.3", true)
	rec.waitFor(t, "term ready", exactly("b=10.1.0.2:8000", "term=10.1.0.3:8000"))
	k.deleteObject(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "term"}})
	rec.waitFor(t, "term terminating", exactly("b=10.1.0.2:8000"))
	k.modifyPod("term", func(p *corev1.Pod) { p.Finalizers = nil }, false)

	k.deleteObject(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "b"}})
	gone := rec.waitFor(t, "b deleted", exactly())
	// More churn after the deletion; b's address must never come back.
	k.setStatus("a", "10.1.0.1", true)
	rec.waitFor(t, "a ready again", exactly("a=10.1.0.1:8000"))
	for _, set := range rec.history(gone) {
		for _, s := range set {
			if s.Address == "10.1.0.2:8000" || s.Address == "10.1.0.3:8000" {
				t.Fatalf("deleted pod's address %s applied again: %v", s.Address, names(set))
			}
		}
	}
}

func TestPoolChanges(t *testing.T) {
	k := newCluster(t)
	k.createPod("a1", map[string]string{"app": "a"})
	k.createPod("b1", map[string]string{"app": "b"})
	k.setStatus("a1", "10.2.0.1", true)
	k.setStatus("b1", "10.2.0.2", true)

	rec := newRecorder()
	// The pool does not exist yet: discovery starts and serves nothing.
	start(t, k8s.Options{PoolName: "pool", PoolNamespace: k.ns}, rec.apply)
	rec.waitFor(t, "no pool, no endpoints", exactly())

	k.createPool("pool", map[string]string{"app": "a"}, 8000)
	rec.waitFor(t, "pool created", exactly("a1=10.2.0.1:8000"))

	k.updatePool("pool", map[string]string{"app": "b"}, 8000)
	rec.waitFor(t, "selector changed", exactly("b1=10.2.0.2:8000"))

	k.updatePool("pool", map[string]string{"app": "b"}, 8000, 8001, 8002)
	rec.waitFor(t, "ports changed", exactly("b1-rank-0=10.2.0.2:8000", "b1-rank-1=10.2.0.2:8001", "b1-rank-2=10.2.0.2:8002"))

	k.deleteObject(&inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: "pool"}})
	rec.waitFor(t, "pool deleted", exactly())
}

func TestSelectorMode(t *testing.T) {
	k := newCluster(t)
	k.createPod("d1", map[string]string{"role": "decode"})
	k.createPod("p1", map[string]string{"role": "prefill"})
	k.setStatus("d1", "10.3.0.1", true)
	k.setStatus("p1", "10.3.0.2", true)

	rec := newRecorder()
	start(t, k8s.Options{EndpointSelector: "role in (decode)", TargetPorts: []int{8200, 8201}, PoolNamespace: k.ns}, rec.apply)
	rec.waitFor(t, "selected pods", exactly("d1-rank-0=10.3.0.1:8200", "d1-rank-1=10.3.0.1:8201"))
}

func TestObjectivePriorities(t *testing.T) {
	k := newCluster(t)
	if !objectivesCRD {
		t.Skip("InferenceObjective CRD not installed: run scripts/envtest.sh")
	}
	k.createPool("pool", map[string]string{"app": "vllm"}, 8000)
	objective := func(name, pool string, priority *int64) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "inference.networking.x-k8s.io/v1alpha2",
			"kind":       "InferenceObjective",
			"metadata":   map[string]any{"name": name, "namespace": k.ns},
			"spec":       map[string]any{"poolRef": map[string]any{"name": pool}},
		}}
		if priority != nil {
			if err := unstructured.SetNestedField(u.Object, *priority, "spec", "priority"); err != nil {
				t.Fatal(err)
			}
		}
		return u
	}
	ptr := func(v int64) *int64 { return &v }
	for _, o := range []*unstructured.Unstructured{
		objective("chat", "pool", ptr(10)),
		objective("batch", "pool", ptr(-1)),
		objective("plain", "pool", nil),
		objective("elsewhere", "other-pool", ptr(7)),
	} {
		if err := k.c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}

	d := start(t, k8s.Options{PoolName: "pool", PoolNamespace: k.ns}, newRecorder().apply)
	waitPriority := func(name string, want int, wantOK bool) {
		t.Helper()
		deadline := time.Now().Add(waitLimit)
		for {
			p, ok := d.Priority(name)
			if p == want && ok == wantOK {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("Priority(%q) = %d, %v; want %d, %v", name, p, ok, want, wantOK)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitPriority("chat", 10, true)
	waitPriority("batch", -1, true)
	waitPriority("plain", 0, true)
	waitPriority("elsewhere", 0, false)
	waitPriority("missing", 0, false)

	var chat unstructured.Unstructured
	chat.SetGroupVersionKind(objective("", "", nil).GroupVersionKind())
	if err := k.c.Get(context.Background(), client.ObjectKey{Namespace: k.ns, Name: "chat"}, &chat); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(chat.Object, int64(3), "spec", "priority"); err != nil {
		t.Fatal(err)
	}
	if err := k.c.Update(context.Background(), &chat); err != nil {
		t.Fatal(err)
	}
	waitPriority("chat", 3, true)
	if err := k.c.Delete(context.Background(), &chat); err != nil {
		t.Fatal(err)
	}
	waitPriority("chat", 0, false)
}

// InferenceObjectives of llm-d's group (llm-d.ai) are read beside GIE's,
// and llm-d's wins when both groups hold an objective of one name.
func TestObjectivePrioritiesBothGroups(t *testing.T) {
	k := newCluster(t)
	if !objectivesCRD || !llmdObjectivesCRD {
		t.Skip("InferenceObjective CRDs not installed: run scripts/envtest.sh")
	}
	k.createPool("pool", map[string]string{"app": "vllm"}, 8000)
	objective := func(apiVersion, name string, priority int64) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": apiVersion,
			"kind":       "InferenceObjective",
			"metadata":   map[string]any{"name": name, "namespace": k.ns},
			"spec":       map[string]any{"poolRef": map[string]any{"name": "pool"}, "priority": priority},
		}}
	}
	const llmd, gie = "llm-d.ai/v1alpha2", "inference.networking.x-k8s.io/v1alpha2"
	for _, o := range []*unstructured.Unstructured{
		objective(llmd, "sheddable", -1),
		objective(gie, "legacy", 4),
		objective(llmd, "both", 9),
		objective(gie, "both", 1),
	} {
		if err := k.c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	d := start(t, k8s.Options{PoolName: "pool", PoolNamespace: k.ns}, newRecorder().apply)
	for name, want := range map[string]int{"sheddable": -1, "legacy": 4, "both": 9} {
		deadline := time.Now().Add(waitLimit)
		for {
			p, ok := d.Priority(name)
			if ok && p == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Priority(%q) = %d, %v; want %d", name, p, ok, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// InferenceModelRewrites of both groups resolve a pool's models; llm-d's
// wins over a namesake in GIE's group, and another pool's rule is not read.
func TestModelRewrites(t *testing.T) {
	k := newCluster(t)
	if !rewritesCRD {
		t.Skip("InferenceModelRewrite CRDs not installed: run scripts/envtest.sh")
	}
	k.createPool("pool", map[string]string{"app": "vllm"}, 8000)
	rewrite := func(apiVersion, name, pool, model, target string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": apiVersion,
			"kind":       "InferenceModelRewrite",
			"metadata":   map[string]any{"name": name, "namespace": k.ns},
			"spec": map[string]any{
				"poolRef": map[string]any{"name": pool},
				"rules": []any{map[string]any{
					"matches": []any{map[string]any{"model": map[string]any{"type": "Exact", "value": model}}},
					"targets": []any{map[string]any{"modelRewrite": target, "weight": int64(100)}},
				}},
			},
		}}
	}
	const llmd, gie = "llm-d.ai/v1alpha2", "inference.networking.x-k8s.io/v1alpha2"
	for _, o := range []*unstructured.Unstructured{
		rewrite(llmd, "llama", "pool", "llama", "llama-v2"),
		rewrite(gie, "qwen", "pool", "qwen", "qwen-lora"),
		rewrite(gie, "llama", "pool", "llama", "shadowed"),
		rewrite(llmd, "elsewhere", "other-pool", "mistral", "mistral-v9"),
	} {
		if err := k.c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	d := start(t, k8s.Options{PoolName: "pool", PoolNamespace: k.ns}, newRecorder().apply)
	for model, want := range map[string]string{"llama": "llama-v2", "qwen": "qwen-lora"} {
		deadline := time.Now().Add(waitLimit)
		for {
			got, _, ok := d.RewriteModel(model)
			if ok && got == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("RewriteModel(%q) = %q, %v; want %q", model, got, ok, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// Another pool's rule: created before the table above was built.
	if got, _, ok := d.RewriteModel("mistral"); ok {
		t.Fatalf("another pool's rewrite applied: %q", got)
	}
}

// TestDatastore wires discovery into the real datastore: the datastore and
// everything above it see only endpoints.Source.
func TestDatastore(t *testing.T) {
	k := newCluster(t)
	k.createPool("pool", map[string]string{"app": "vllm"}, 8000)
	k.createPod("a", map[string]string{"app": "vllm"})
	k.setStatus("a", "10.4.0.1", true)

	d, err := k8s.New(k8s.Options{PoolName: "pool", PoolNamespace: k.ns, RestConfig: suite.Env(t).Config})
	if err != nil {
		t.Fatal(err)
	}
	var src endpoints.Source = d
	ds := endpoints.NewDatastore()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ds.Run(ctx, src) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	waitCandidates := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(waitLimit)
		for {
			var got []string
			for _, e := range ds.Candidates() {
				got = append(got, e.Name()+"="+e.Address())
			}
			if slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("candidates = %v, want %v", got, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitCandidates("a=10.4.0.1:8000")
	if e := ds.ByAddress("10.4.0.1:8000"); e == nil || e.Label("app") != "vllm" {
		t.Fatalf("ByAddress = %v", e)
	}
	k.setStatus("a", "10.4.0.1", false)
	waitCandidates()
}

func TestStartupErrors(t *testing.T) {
	k := newCluster(t)
	nobody := suite.Env(t).ServiceAccountConfig(k.ns, "nobody")
	tests := []struct {
		name string
		cfg  *rest.Config
		opts k8s.Options
		want string
	}{
		{name: "no rights", cfg: nobody, opts: k8s.Options{PoolName: "pool", PoolNamespace: k.ns}, want: "forbidden"},
		{name: "no rights, selector mode", cfg: nobody, opts: k8s.Options{EndpointSelector: "app=x", TargetPorts: []int{1}, PoolNamespace: k.ns}, want: "forbidden"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.RestConfig = tc.cfg
			d, err := k8s.New(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			err = d.Run(ctx, func([]endpoints.Spec) error { return nil })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestRunTwice(t *testing.T) {
	k := newCluster(t)
	d, err := k8s.New(k8s.Options{EndpointSelector: "app=x", TargetPorts: []int{1}, PoolNamespace: k.ns, RestConfig: suite.Env(t).Config})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	results := make(chan error, 2)
	for range 2 {
		go func() { results <- d.Run(ctx, func([]endpoints.Spec) error { return nil }) }()
	}
	// Whichever call comes second is refused at once; the first runs until
	// cancelled and then returns nil.
	if err := <-results; !errors.Is(err, k8s.ErrAlreadyRunning) {
		t.Fatalf("first result = %v, want ErrAlreadyRunning", err)
	}
	cancel()
	if err := <-results; err != nil {
		t.Fatalf("Run = %v after cancel, want nil", err)
	}
	// The informers cannot restart, so a finished Discovery stays finished.
	if err := d.Run(context.Background(), func([]endpoints.Spec) error { return nil }); !errors.Is(err, k8s.ErrAlreadyRunning) {
		t.Fatalf("Run after Run = %v, want ErrAlreadyRunning", err)
	}
}

// BenchmarkReadyToRoutable measures the time from a pod's Ready status
// being written to the API server until discovery applies a set that
// contains it: watch delivery, the coalescing window and the rebuild.
func BenchmarkReadyToRoutable(b *testing.B) {
	k := newCluster(b)
	k.createPool("pool", map[string]string{"app": "vllm"}, 8000)
	rec := newRecorder()
	start(b, k8s.Options{PoolName: "pool", PoolNamespace: k.ns}, rec.apply)
	rec.waitFor(b, "the initial set", exactly())

	var total time.Duration
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("p%d", i)
		b.StopTimer()
		k.createPod(name, map[string]string{"app": "vllm"})
		b.StartTimer()
		ip := fmt.Sprintf("10.5.%d.%d", i/250, i%250+1)
		k.setStatus(name, ip, true)
		written := time.Now()
		addr := ip + ":8000"
		rec.waitFor(b, name+" routable", func(s []endpoints.Spec) bool {
			return slices.ContainsFunc(s, func(x endpoints.Spec) bool { return x.Address == addr })
		})
		total += time.Since(written)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms-after-write/op")
}
