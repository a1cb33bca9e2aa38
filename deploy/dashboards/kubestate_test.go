package dashboards

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvgate/kvgate/extproc/endpoints/k8s/k8stest"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/testutil/proctest"
)

// kubeStateMetricsBinary is where scripts/envtest.sh builds
// kube-state-metrics, beside kube-apiserver. It returns "" (the test then
// explains the kube_* queries instead of running them) when the binary or
// the control plane is missing and envtest is not required.
func kubeStateMetricsBinary(t *testing.T) string {
	t.Helper()
	dir, err := k8stest.AssetsDir()
	if err == nil {
		bin := filepath.Join(dir, "kube-state-metrics")
		if _, err = os.Stat(bin); err == nil {
			return bin
		}
	}
	if k8stest.Required() {
		t.Fatalf("kube-state-metrics (make envtest builds it): %v", err)
	}
	t.Logf("no kube-state-metrics, the kube_* queries are explained instead: %v", err)
	return ""
}

// deploymentState is the status given to every scaled Deployment: what a
// rollout in progress reports (one pod not yet ready), so that the
// queue-guard's pending count and the SLO policy's ready/provisioned
// credit read non-trivial values.
var deploymentState = appsv1.DeploymentStatus{Replicas: 3, UpdatedReplicas: 3, ReadyReplicas: 2, AvailableReplicas: 2, UnavailableReplicas: 1}

// startKubeStateMetrics runs a real kube-apiserver (envtest) holding the
// Deployments the scaling objects target, in the test namespace with the
// status above, and kube-state-metrics (the binary users run) watching it.
// It returns the scrape target, with no target labels: kube-state-metrics'
// own namespace and deployment labels must survive the scrape, as
// honor_labels keeps them in the usual ServiceMonitor.
func startKubeStateMetrics(t *testing.T, bin string, deployments []string) scrapeTarget {
	t.Helper()
	env, err := k8stest.Start()
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping envtest: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range deployments {
		labels := map[string]string{"app": name}
		replicas := deploymentState.Replicas
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace},
			Spec: appsv1.DeploymentSpec{
				Replicas: &replicas,
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
				},
			},
		}
		created, err := cs.AppsV1().Deployments(testNamespace).Create(ctx, d, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("deployment %s: %v", name, err)
		}
		// No controller manager runs: the status is what one would write.
		created.Status = deploymentState
		created.Status.ObservedGeneration = created.Generation
		if _, err := cs.AppsV1().Deployments(testNamespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("deployment %s status: %v", name, err)
		}
	}

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	// Port 0 for both servers: each logs the address it bound ("Listening
	// on", in no set order), and the one serving the Deployments' series is
	// the metrics server.
	proc, _ := proctest.Start(t, proctest.ListeningOn, nil, bin, "--kubeconfig="+kubeconfig, "--host=127.0.0.1", "--port=0",
		"--telemetry-host=127.0.0.1", "--telemetry-port=0", "--resources=deployments,pods", "--namespaces="+testNamespace)
	var bound []string
	testutil.WaitFor(t, "kube-state-metrics' two listening lines", func() bool {
		bound = bound[:0]
		for _, m := range proctest.ListeningOn.FindAllStringSubmatch(proc.Log.String(), -1) {
			bound = append(bound, m[1])
		}
		return len(bound) == 2
	})
	// Ready once its informers have synced every Deployment.
	want := fmt.Sprintf(`kube_deployment_status_replicas_ready{namespace=%q,deployment=%q}`, testNamespace, deployments[len(deployments)-1])
	var addr string
	for addr == "" {
		var err error
		for _, a := range bound {
			var body string
			if body, err = get(ctx, "http://"+a+"/metrics"); err == nil && strings.Contains(body, want) {
				addr = a
			}
		}
		if addr != "" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("kube-state-metrics not serving %s on %v: %v\n%s", want, bound, err, proc.Log.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	return scrapeTarget{Job: "kube-state-metrics", Addr: addr}
}

func get(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = errors.New(resp.Status)
	}
	return string(b), err
}
