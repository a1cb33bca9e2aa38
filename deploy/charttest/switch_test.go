package charttest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/extproc/endpoints/k8s/k8stest"
	"github.com/kvgate/kvgate/internal/ociimage"
	"github.com/kvgate/kvgate/internal/testutil"
)

// The switching test runs the Deployment that the GIE v1.5 and
// llm-d-router v0.9 charts render (testdata/upstream, unedited chart
// output) against kvgate's picker image as a kubelet would: the objects
// are accepted by the real API server and created; the container's
// filesystem is the image's layer with the chart's ConfigMap mounted where
// the Deployment mounts it and the service-account token where a kubelet
// puts it; the process is the image's entrypoint with exactly the
// container's args, the pod's environment (fieldRefs resolved) and the
// image's user; its liveness and readiness probes are run as the kubelet
// runs gRPC probes. Only the image differs from upstream's.

// pickerImage is `make images`' picker image.
func pickerImage(t *testing.T) string {
	t.Helper()
	var dirs []string
	if d := os.Getenv("KVGATE_BIN_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	if root, err := testutil.FindRepoRoot(); err == nil {
		dirs = append(dirs, filepath.Join(root, "bin"))
	}
	for _, d := range dirs {
		if p := filepath.Join(d, "images", "kvgate-epp.tar"); fileExists(p) {
			return p
		}
	}
	if k8stest.Required() {
		t.Fatal("bin/images/kvgate-epp.tar missing: run make images")
	}
	t.Skip("bin/images/kvgate-epp.tar missing: run make images")
	return ""
}

func readManifest(t *testing.T, file string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "upstream", file))
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if m != nil {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	return objs
}

// kubelet runs one pod of a Deployment on this machine.
type kubelet struct {
	t       *testing.T
	cs      kubernetes.Interface
	image   string
	apiHost string // host:port of the API server
	caData  []byte
}

type pod struct {
	cmd    *exec.Cmd
	argv   []string
	stderr *testutil.SyncBuffer
	exited chan error
	spec   corev1.PodSpec
}

// dataLayerTypes are the llm-d data-layer plugins of the charts' default
// configuration, which the config-compatibility work adds to kvgate.
var dataLayerTypes = []string{"metrics-data-source", "core-metrics-extractor"}

// withoutDataLayer removes those plugins from an EndpointPickerConfig.
func withoutDataLayer(t *testing.T, doc string) string {
	t.Helper()
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(doc), &cfg); err != nil {
		t.Fatal(err)
	}
	plugins, _ := cfg["plugins"].([]any)
	kept := plugins[:0]
	for _, p := range plugins {
		if ty, _ := p.(map[string]any)["type"].(string); !slices.Contains(dataLayerTypes, ty) {
			kept = append(kept, p)
		}
	}
	cfg["plugins"] = kept
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// start lays out the container's root file system and starts its
// process.
func (k *kubelet) start(d *appsv1.Deployment, configMaps map[string]*corev1.ConfigMap, podName string) *pod {
	t := k.t
	t.Helper()
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(spec.Containers))
	}
	c := spec.Containers[0]
	if len(c.Command) > 0 {
		t.Fatalf("the chart overrides the entrypoint: %v", c.Command)
	}
	img, err := ociimage.Read(k.image, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	mustWrite := func(p string, data []byte, mode os.FileMode) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	entry := cf.Config.Entrypoint
	bin, err := ociimage.Extract(img, entry[0])
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(entry[0], bin, 0o755)
	// Volumes: the ConfigMaps the container mounts.
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.ConfigMap == nil {
				t.Fatalf("volume %s: only ConfigMap volumes are laid out", v.Name)
			}
			cm := configMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Fatalf("volume %s: ConfigMap %s not rendered", v.Name, v.ConfigMap.Name)
			}
			for key, val := range cm.Data {
				mustWrite(filepath.Join(m.MountPath, key), []byte(val), 0o644)
			}
		}
	}
	// The service account's token, as projected into every pod.
	tr, err := k.cs.CoreV1().ServiceAccounts(d.Namespace).CreateToken(context.Background(), spec.ServiceAccountName, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", spec.ServiceAccountName, err)
	}
	sa := "/var/run/secrets/kubernetes.io/serviceaccount"
	mustWrite(sa+"/token", []byte(tr.Status.Token), 0o644)
	mustWrite(sa+"/ca.crt", k.caData, 0o644)
	mustWrite(sa+"/namespace", []byte(d.Namespace), 0o644)

	host, port, err := net.SplitHostPort(k.apiHost)
	if err != nil {
		t.Fatal(err)
	}
	env := append(slices.Clone(cf.Config.Env), "KUBERNETES_SERVICE_HOST="+host, "KUBERNETES_SERVICE_PORT="+port)
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env = append(env, e.Name+"="+d.Namespace)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env = append(env, e.Name+"="+podName)
		default:
			t.Fatalf("env %s: source not emulated", e.Name)
		}
	}
	var uid, gid uint32
	if _, err := fmt.Sscanf(cf.Config.User, "%d:%d", &uid, &gid); err != nil || uid == 0 {
		t.Fatalf("image user %q: want a numeric non-root uid:gid", cf.Config.User)
	}
	p := &pod{argv: append(slices.Clone(entry), c.Args...), stderr: &testutil.SyncBuffer{}, exited: make(chan error, 1), spec: spec}
	p.cmd = &exec.Cmd{
		Path: entry[0], Args: p.argv, Env: env, Dir: "/",
		Stdout: io.Discard, Stderr: p.stderr,
		SysProcAttr: &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uid, Gid: gid}},
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %v: %v", p.argv, err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	return p
}

// stop is the kubelet's SIGTERM, then SIGKILL after a grace period.
func (p *pod) stop(t *testing.T) error {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		return err
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return errors.New("did not stop within 30 s of SIGTERM")
	}
}

// probe runs a gRPC probe as the kubelet does: plaintext to the pod's
// port, the named service, success on SERVING only.
func probe(ctx context.Context, pr *corev1.Probe) error {
	if pr == nil || pr.GRPC == nil {
		return fmt.Errorf("not a gRPC probe: %+v", pr)
	}
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", pr.GRPC.Port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	svc := ""
	if pr.GRPC.Service != nil {
		svc = *pr.GRPC.Service
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second) // the kubelet's default timeoutSeconds
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		return err
	}
	if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("service %q: %v", svc, r.GetStatus())
	}
	return nil
}

// awaitProbes waits for both probes to pass, or the process to exit.
func (p *pod) awaitProbes(t *testing.T) error {
	t.Helper()
	c := p.spec.Containers[0]
	deadline := time.Now().Add(45 * time.Second)
	for {
		lerr := probe(context.Background(), c.LivenessProbe)
		rerr := probe(context.Background(), c.ReadinessProbe)
		if lerr == nil && rerr == nil {
			return nil
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			return fmt.Errorf("exited (%v): %s", err, p.stderr.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("probes never passed (liveness: %v, readiness: %v): %s", lerr, rerr, p.stderr.String())
		}
	}
}

func requirePortsFree(t *testing.T, c corev1.Container) {
	t.Helper()
	for _, p := range c.Ports {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p.ContainerPort))
		if err != nil {
			t.Fatalf("port %d (%s) the Deployment uses is taken on this machine: %v", p.ContainerPort, p.Name, err)
		}
		ln.Close()
	}
}

func TestUpstreamDeploymentRunsKvgate(t *testing.T) {
	if os.Geteuid() != 0 {
		if k8stest.Required() {
			t.Fatal("the switching test lays out a container root and needs root (chroot)")
		}
		t.Skip("needs root (chroot)")
	}
	image := pickerImage(t)
	env := suite.Env(t)
	c := adminClient(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	ensureNamespace(t, c, releaseNamespace)
	k := &kubelet{t: t, cs: cs, image: image, apiHost: u.Host, caData: env.Config.CAData}

	imageRef, err := ociimage.RefName(image)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		file string
		// values renders kvgate's own chart with a ci/ value set instead.
		values string
		// ha: two replicas rendered, so --ha-enable-leader-election and
		// the liveness / readiness probe services.
		ha bool
	}{
		{file: "gie-v1.5.0.yaml"},
		{file: "gie-v1.5.0-istio.yaml"},
		{file: "gie-v1.5.0-ha.yaml", ha: true},
		{file: "llm-d-router-v0.9.0.yaml"},
		{file: "llm-d-router-v0.9.0-ha.yaml", ha: true},
		{values: "default-values.yaml"},
		{values: "gie-values.yaml", ha: true},
	}
	for _, tc := range tests {
		t.Run(tc.file+tc.values, func(t *testing.T) {
			k.t = t
			var objs []*unstructured.Unstructured
			if tc.file != "" {
				objs = readManifest(t, tc.file)
			} else {
				// A release name of its own: the other tests' objects stay.
				objs = mustRender(t, tc.values, "fullnameOverride=switch")
			}
			var dep *appsv1.Deployment
			configMaps := map[string]*corev1.ConfigMap{}
			for _, o := range objs {
				if o.GetNamespace() == "" && o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" {
					o.SetNamespace(releaseNamespace) // helm leaves it to the install's namespace
				}
				if crd := crdFor(o.GroupVersionKind()); crd != "" && !crdFiles[crd] {
					t.Fatalf("%s: CRD %s missing: run scripts/envtest.sh", o.GetKind(), crd)
				}
				if err := c.Create(context.Background(), o.DeepCopy(), client.DryRunAll); err != nil {
					t.Fatalf("the API server rejects %s %s: %v", o.GetKind(), o.GetName(), err)
				}
				switch o.GetKind() {
				case "Deployment":
					dep = &appsv1.Deployment{}
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, dep); err != nil {
						t.Fatal(err)
					}
				case "ConfigMap":
					cm := &corev1.ConfigMap{}
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cm); err != nil {
						t.Fatal(err)
					}
					configMaps[cm.Name] = cm
				}
			}
			if dep == nil {
				t.Fatal("no Deployment rendered")
			}
			if img := dep.Spec.Template.Spec.Containers[0].Image; tc.values != "" && img != imageRef {
				t.Errorf("the chart names image %s; make images builds %s", img, imageRef)
			}
			// Created for real: the picker reads the pool and the pods with
			// the chart's own RBAC, through its service account.
			for _, o := range objs {
				if err := c.Create(context.Background(), o.DeepCopy()); err != nil {
					t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
			t.Cleanup(func() {
				for _, o := range objs {
					_ = c.Delete(context.Background(), o.DeepCopy())
				}
			})
			requirePortsFree(t, dep.Spec.Template.Spec.Containers[0])

			p := k.start(dep, configMaps, dep.Name+"-7d9f-x2x")
			err := p.awaitProbes(t)
			if err != nil && strings.Contains(err.Error(), `unknown plugin type "metrics-data-source"`) {
				// The chart's default config names llm-d's data-layer
				// plugins; where kvgate lacks them the config is refused
				// by name (not ignored). Run the same Deployment with
				// only those two plugins taken out of the ConfigMap.
				t.Logf("the chart's data-layer plugins %v are not in this build; running with them removed from the ConfigMap", dataLayerTypes)
				for name, cm := range configMaps {
					cm = cm.DeepCopy()
					for key, doc := range cm.Data {
						cm.Data[key] = withoutDataLayer(t, doc)
					}
					configMaps[name] = cm
				}
				p = k.start(dep, configMaps, dep.Name+"-7d9f-x2y")
				err = p.awaitProbes(t)
			}
			if err != nil {
				t.Fatalf("%v: %v", p.argv, err)
			}
			want := append([]string{"/kvgate", "epp"}, dep.Spec.Template.Spec.Containers[0].Args...)
			if !slices.Equal(p.argv, want) {
				t.Errorf("argv = %q, want the entrypoint and the chart's args %q", p.argv, want)
			}
			if tc.ha != slices.Contains(want, "--ha-enable-leader-election") {
				t.Fatalf("ha %v but args %q", tc.ha, want)
			}
			if tc.ha {
				// The one replica leads, on the Lease llm-d's picker uses.
				var lease coordinationv1.Lease
				key := client.ObjectKey{Namespace: releaseNamespace, Name: "epp-llm-" + argValue(want, "--pool-name") + ".llm-d.ai"}
				if err := c.Get(context.Background(), key, &lease); err != nil {
					t.Fatalf("Lease: %v", err)
				}
				if h := lease.Spec.HolderIdentity; h == nil || !strings.HasPrefix(*h, dep.Name+"-7d9f-") {
					t.Errorf("Lease holder = %v, want the pod", h)
				}
				t.Cleanup(func() { _ = c.Delete(context.Background(), &lease) })
			}
			// The gateway dials the ext_proc port with TLS without
			// verifying (Istio's DestinationRule from the chart: SIMPLE,
			// insecureSkipVerify), as with the upstream picker.
			creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
			conn, err := grpc.NewClient("127.0.0.1:9002", grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
			cancel()
			conn.Close()
			if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("ext_proc port over TLS: %v %v", r.GetStatus(), err)
			}
			// The charts leave metrics auth on unless told: no token, no
			// metrics.
			wantStatus := http.StatusUnauthorized
			if slices.Contains(want, "--metrics-endpoint-auth=false") {
				wantStatus = http.StatusOK
			}
			if resp, err := http.Get("http://127.0.0.1:9090/metrics"); err != nil {
				t.Errorf("metrics port: %v", err)
			} else {
				resp.Body.Close()
				if resp.StatusCode != wantStatus {
					t.Errorf("metrics without a token: %d, want %d", resp.StatusCode, wantStatus)
				}
			}
			if err := p.stop(t); err != nil {
				t.Errorf("after SIGTERM: %v: %s", err, p.stderr.String())
			}
		})
	}
}
