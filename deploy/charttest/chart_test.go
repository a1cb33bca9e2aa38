package charttest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/k8s"
	"github.com/kvgate/kvgate/extproc/endpoints/k8s/k8stest"
	"github.com/kvgate/kvgate/extproc/epp"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/testutil"
)

const releaseNamespace = "llm"

var (
	suite k8stest.Suite
	// crdFiles are the extra CRDs installed, by file name.
	crdFiles = map[string]bool{}
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	var extra []string
	if dir, err := k8stest.ExtraCRDDir(); err == nil {
		if entries, err := os.ReadDir(dir); err == nil {
			for _, e := range entries {
				crdFiles[e.Name()] = true
			}
			if len(entries) > 0 {
				extra = append(extra, dir)
			}
		}
	}
	return suite.Main(m, extra...)
}

func chartDir(t testing.TB) string {
	t.Helper()
	root, err := testutil.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", "helm", "kvgate")
}

// helm finds the helm binary (k8stest.Helm).
func helm(t testing.TB) string { return k8stest.Helm(t) }

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// render runs helm template with a value set from ci/ (or none) and --set
// arguments, and decodes the objects.
func render(t testing.TB, valuesFile string, sets ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return renderArgs(t, valuesFile, args...)
}

// renderArgs is render with raw helm arguments.
func renderArgs(t testing.TB, valuesFile string, extra ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	dir := chartDir(t)
	// helm template assumes an old cluster version unless told; render for
	// the API server the dry runs use.
	args := []string{"template", "kvgate", dir, "--namespace", releaseNamespace, "--kube-version", "1.37.2"}
	if valuesFile != "" {
		args = append(args, "--values", filepath.Join(dir, "ci", valuesFile))
	}
	cmd := exec.Command(helm(t), append(args, extra...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm template: %w: %s", err, stderr.String())
	}
	return k8stest.DecodeObjects(out)
}

func mustRender(t testing.TB, valuesFile string, sets ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := render(t, valuesFile, sets...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func kinds(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind())
	}
	slices.Sort(out)
	return out
}

func find(t testing.TB, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind {
			return o
		}
	}
	t.Fatalf("no %s rendered; got %v", kind, kinds(objs))
	return nil
}

func str(t testing.TB, o *unstructured.Unstructured, path ...string) string {
	t.Helper()
	v, _, err := unstructured.NestedFieldNoCopy(o.Object, path...)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(v)
}

// containerArgs returns the picker container's arguments.
func containerArgs(t testing.TB, objs []*unstructured.Unstructured) []string {
	t.Helper()
	d := find(t, objs, "Deployment")
	cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("want one container, got %d", len(cs))
	}
	raw, _ := cs[0].(map[string]any)["args"].([]any)
	var args []string
	for _, a := range raw {
		args = append(args, fmt.Sprint(a))
	}
	return args
}

func argValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

func TestRender(t *testing.T) {
	base := []string{"ConfigMap", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"}
	tests := []struct {
		values string
		kinds  []string
		check  func(t *testing.T, objs []*unstructured.Unstructured)
	}{
		{
			values: "default-values.yaml",
			kinds:  append(slices.Clone(base), "InferencePool"),
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				pool := find(t, objs, "InferencePool")
				if got := str(t, pool, "spec", "endpointPickerRef", "name"); got != "kvgate-epp" {
					t.Errorf("endpointPickerRef.name = %s", got)
				}
				if got := str(t, pool, "spec", "endpointPickerRef", "port", "number"); got != "9002" {
					t.Errorf("endpointPickerRef.port = %s", got)
				}
				// FailOpen by default, as upstream.
				if got := str(t, pool, "spec", "endpointPickerRef", "failureMode"); got != "FailOpen" {
					t.Errorf("failureMode = %s", got)
				}
				// The default configuration is GIE's default profile.
				want, err := config.Parse([]byte(config.DefaultYAML))
				if err != nil {
					t.Fatal(err)
				}
				if got := pickerConfig(t, objs); !reflect.DeepEqual(got, want) {
					t.Errorf("default picker config = %+v, want GIE's default %+v", got, want)
				}
				args := containerArgs(t, objs)
				if slices.Contains(args, "--secure-serving=false") || slices.Contains(args, "--metrics-endpoint-auth=false") {
					t.Errorf("TLS and metrics auth stay on by default, as upstream: %v", args)
				}
				if got := str(t, find(t, objs, "Deployment"), "spec", "template", "spec", "containers"); !strings.Contains(got, "image:ghcr.io/kvgate/kvgate-epp:0.1.0") {
					t.Errorf("image: %s", got)
				}
			},
		},
		{
			values: "live-model-values.yaml",
			kinds:  append(slices.Clone(base), "InferencePool"),
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				// The documented live-model profile builds with the
				// picker's own registry, producers and admitter bound.
				cfg := pickerConfig(t, objs)
				built, err := config.Build(cfg, all.Registry(), &scheduling.Handle{Services: map[string]any{}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(built.FirstToken) == 0 {
					t.Error("no plugin learns from first tokens: the latency producer is not bound")
				}
			},
		},
		{
			values: "existing-pool-values.yaml",
			kinds:  base,
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				if got := argValue(containerArgs(t, objs), "--pool-name"); got != "vllm-llama3-8b-instruct" {
					t.Errorf("--pool-name = %s", got)
				}
				if got := str(t, find(t, objs, "RoleBinding"), "subjects"); !strings.Contains(got, "llm-picker") {
					t.Errorf("RoleBinding subjects = %s", got)
				}
			},
		},
		{
			values: "multiport-values.yaml",
			kinds:  append(slices.Clone(base), "ClusterRole", "ClusterRoleBinding", "InferencePool", "Secret", "ServiceMonitor"),
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				pool := find(t, objs, "InferencePool")
				if got := str(t, pool, "spec", "targetPorts"); got != "[map[number:8000] map[number:8001] map[number:8002] map[number:8003]]" {
					t.Errorf("targetPorts = %s", got)
				}
				if got := str(t, pool, "spec", "endpointPickerRef", "failureMode"); got != "FailClose" {
					t.Errorf("failureMode = %s", got)
				}
				// Authenticated scrapes with the picker's token.
				if got := str(t, find(t, objs, "ServiceMonitor"), "spec", "endpoints"); !strings.Contains(got, "inference-gateway-sa-metrics-reader-secret") || !strings.Contains(got, "port:http-metrics") {
					t.Errorf("ServiceMonitor endpoints = %s", got)
				}
			},
		},
		{
			values: "envoy-gateway-values.yaml",
			kinds:  append(slices.Clone(base), "EnvoyExtensionPolicy", "InferencePool"),
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				p := find(t, objs, "EnvoyExtensionPolicy")
				if got := str(t, p, "spec", "wasm"); !strings.Contains(got, "type:HTTP") || !strings.Contains(got, "sha256") {
					t.Errorf("wasm = %s", got)
				}
				// With the filter in front, ext_proc runs headers-only.
				if got := str(t, p, "spec", "extProc"); !strings.Contains(got, "request:map[]") || !strings.Contains(got, "failOpen:false") {
					t.Errorf("extProc = %s", got)
				}
				// The policy's ext_proc is plaintext.
				if !slices.Contains(containerArgs(t, objs), "--secure-serving=false") {
					t.Errorf("args = %v, want --secure-serving=false", containerArgs(t, objs))
				}
			},
		},
		{
			values: "istio-values.yaml",
			kinds:  append(slices.Clone(base), "EnvoyFilter", "InferencePool", "WasmPlugin"),
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				w := find(t, objs, "WasmPlugin")
				if got := str(t, w, "spec", "url"); got != "oci://ghcr.io/kvgate/kvgate-filter:0.1.0" {
					t.Errorf("WasmPlugin url = %s", got)
				}
				if w.GetNamespace() != "istio-system" {
					t.Errorf("WasmPlugin namespace = %s", w.GetNamespace())
				}
				f := find(t, objs, "EnvoyFilter")
				if got := str(t, f, "spec", "configPatches"); !strings.Contains(got, "outbound|9002||kvgate-epp.llm.svc.cluster.local") ||
					!strings.Contains(got, "request_body_mode:NONE") || !strings.Contains(got, "http_header_name:x-gateway-destination-endpoint") {
					t.Errorf("EnvoyFilter patches = %s", got)
				}
			},
		},
		{
			values: "gie-values.yaml",
			kinds:  append(slices.Clone(base), "DestinationRule", "InferenceObjective", "InferenceObjective", "InferencePool", "Role", "RoleBinding", "ServiceMonitor"),
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				args := containerArgs(t, objs)
				for _, want := range []string{"--ha-enable-leader-election", "--v=3", "--refresh-metrics-interval=100ms", "--metrics-endpoint-auth=false"} {
					if !slices.Contains(args, want) {
						t.Errorf("args %v lack %s", args, want)
					}
				}
				if got := str(t, find(t, objs, "Deployment"), "spec", "template", "spec", "containers"); !strings.Contains(got, "service:readiness") || !strings.Contains(got, "service:liveness") {
					t.Errorf("HA probes: %s", got)
				}
				dr := find(t, objs, "DestinationRule")
				if got := str(t, dr, "spec"); !strings.Contains(got, "host:kvgate-epp.llm.svc.cluster.local") || !strings.Contains(got, "mode:SIMPLE") || !strings.Contains(got, "maxRequestsPerConnection:256000") {
					t.Errorf("DestinationRule = %s", got)
				}
				if got := str(t, find(t, objs, "Service"), "spec", "ports"); !strings.Contains(got, "port:8081") {
					t.Errorf("extraServicePorts missing: %s", got)
				}
				if got := str(t, find(t, objs, "InferencePool"), "spec", "selector"); !strings.Contains(got, "app:sglang-qwen3-32b") {
					t.Errorf("pool selector = %s", got)
				}
			},
		},
		{
			values: "llm-d-router-values.yaml",
			kinds:  append(slices.Clone(base), "InferenceObjective", "InferencePool"),
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				args := containerArgs(t, objs)
				if !slices.Contains(args, "--v=4") || !slices.Contains(args, "--tracing=true") || argValue(args, "--config-file") != "/config/custom-plugins.yaml" {
					t.Errorf("args = %v", args)
				}
				pool := find(t, objs, "InferencePool")
				if got := str(t, pool, "spec", "endpointPickerRef", "failureMode"); got != "FailClose" {
					t.Errorf("router.inferencePool.failureMode not applied: %s", got)
				}
				if got := str(t, find(t, objs, "Deployment"), "spec", "template", "spec", "containers"); !strings.Contains(got, "http://otel-collector.monitoring:4317") {
					t.Errorf("tracing env: %s", got)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.values, func(t *testing.T) {
			objs := mustRender(t, tc.values)
			want := slices.Clone(tc.kinds)
			slices.Sort(want)
			if got := kinds(objs); !slices.Equal(got, want) {
				t.Fatalf("kinds = %v, want %v", got, want)
			}
			checkCommon(t, objs)
			tc.check(t, objs)
		})
	}
}

// checkCommon checks what every value set must get right: the picker's
// command line (the upstream flags, parsed by the picker itself), ports
// and probes, a parsable configuration, and RBAC that stays in the
// namespace but for the metrics-auth reviews.
func checkCommon(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	args := containerArgs(t, objs)
	if argValue(args, "--pool-namespace") != releaseNamespace || !strings.HasPrefix(argValue(args, "--config-file"), "/config/") {
		t.Errorf("picker args = %v", args)
	}
	if _, err := epp.ParseFlags(args, io.Discard); err != nil {
		t.Errorf("kvgate epp refuses the chart's args %v: %v", args, err)
	}
	for _, o := range objs {
		if o.GetKind() == "InferencePool" && argValue(args, "--pool-name") != o.GetName() {
			t.Errorf("--pool-name %s does not name the rendered pool %s", argValue(args, "--pool-name"), o.GetName())
		}
	}
	d := find(t, objs, "Deployment")
	c := str(t, d, "spec", "template", "spec", "containers")
	for _, want := range []string{"containerPort:9002", "containerPort:9003", "containerPort:9090", "readinessProbe:map[grpc:map[port:9003 service:"} {
		if !strings.Contains(c, want) {
			t.Errorf("container lacks %s: %s", want, c)
		}
	}
	if got := str(t, find(t, objs, "Service"), "spec", "ports"); !strings.Contains(got, "name:grpc-ext-proc") || !strings.Contains(got, "port:9002") || !strings.Contains(got, "name:http-metrics") {
		t.Errorf("service ports = %s", got)
	}
	pickerConfig(t, objs)
	for _, o := range objs {
		if strings.HasPrefix(o.GetKind(), "Cluster") {
			if rules := str(t, o, "rules"); o.GetKind() == "ClusterRole" && (!strings.Contains(rules, "tokenreviews") || strings.Contains(rules, "pods")) {
				t.Errorf("cluster-scoped %s grants %s", o.GetName(), rules)
			}
		}
	}
	var main *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Role" && !strings.HasSuffix(o.GetName(), "-leader-election") {
			main = o
		}
	}
	if main == nil {
		t.Fatal("no Role")
	}
	rules := str(t, main, "rules")
	for _, r := range []string{"pods", "inferencepools", "inferenceobjectives", "inferencemodelrewrites", "llm-d.ai", "inference.networking.x-k8s.io"} {
		if !strings.Contains(rules, r) {
			t.Errorf("Role lacks %s: %s", r, rules)
		}
	}
	if strings.Contains(rules, "create") || strings.Contains(rules, "update") || strings.Contains(rules, "delete") || strings.Contains(rules, "*") {
		t.Errorf("Role grants more than reading: %s", rules)
	}
}

// pickerConfig parses the ConfigMap's config.yaml with the picker's own
// parser.
func pickerConfig(t testing.TB, objs []*unstructured.Unstructured) *config.Config {
	t.Helper()
	file := strings.TrimPrefix(argValue(containerArgs(t, objs), "--config-file"), "/config/")
	data := str(t, find(t, objs, "ConfigMap"), "data", file)
	c, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("the picker would reject the chart's config: %v\n%s", err, data)
	}
	return c
}

// TestRenderConfigText takes an existing picker's file verbatim, as the
// migration in docs/kubernetes.md does.
func TestRenderConfigText(t *testing.T) {
	root, err := testutil.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "extproc", "config", "testdata", "llm-d-decode.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Skipf("no llm-d configuration to migrate: %v", err)
	}
	want, err := config.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := renderArgs(t, "default-values.yaml", "--set-file", `inferenceExtension.pluginsCustomConfig.old\.yaml=`+file,
		"--set", "inferenceExtension.pluginsConfigFile=old.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := pickerConfig(t, objs); !reflect.DeepEqual(got, want) {
		t.Errorf("config = %+v, want the file's %+v", got, want)
	}
}

func TestRenderRejects(t *testing.T) {
	tests := []struct {
		name string
		sets []string
		want string
	}{
		{name: "failure mode", sets: []string{"inferenceExtension.failureMode=Sometimes"}, want: "failureMode"},
		{name: "no ports", sets: []string{"inferencePool.targetPorts=null"}, want: "1 to 8 ports"},
		{name: "empty selector", sets: []string{"inferencePool.modelServers=null"}, want: "matchLabels is required"},
		{name: "unknown key", sets: []string{"inferenceExtension.bogus=1"}, want: "bogus"},
		{name: "unknown top-level key", sets: []string{"picker.extraArgs={--x}"}, want: "picker"},
		{name: "triton", sets: []string{"inferencePool.modelServerType=triton-tensorrt-llm"}, want: "vllm and sglang"},
		{name: "grpc model servers", sets: []string{"inferencePool.modelServerProtocol=grpc"}, want: "modelServerProtocol"},
		{name: "latency predictor sidecars", sets: []string{"inferenceExtension.latencyPredictor.enabled=true"}, want: "latencyPredictor"},
		{name: "metrics path", sets: []string{"inferenceExtension.metricsDataSource.path=/stats"}, want: "metricsDataSource"},
		{name: "config file", sets: []string{"inferenceExtension.pluginsConfigFile=mine.yaml"}, want: "pluginsConfigFile"},
		{name: "gke", sets: []string{"provider.name=gke"}, want: "provider.name"},
		{name: "istio without TLS", sets: []string{"provider.name=istio", "inferenceExtension.flags.secure-serving=false"}, want: "TLS"},
		{name: "HTTP wasm without digest", sets: []string{"wasmFilter.type=HTTP"}, want: "sha256 is required"},
		{name: "service account", sets: []string{"serviceAccount.create=false"}, want: "serviceAccount.name is required"},
		{name: "empty policy", sets: []string{"envoyGateway.enabled=true", "envoyGateway.wasm.enabled=false"}, want: "needs envoyGateway.wasm.enabled"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, "default-values.yaml", tc.sets...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// crdFor names the extra CRD file a kind needs; "" means the API is
// built in or its CRD comes from the GIE module (always installed).
func crdFor(gvk schema.GroupVersionKind) string {
	switch gvk.Group {
	case "monitoring.coreos.com":
		if gvk.Kind == "PrometheusRule" {
			return "prometheusrules.yaml"
		}
		return "servicemonitors.yaml"
	case "keda.sh":
		return "keda-scaledobjects.yaml"
	case "gateway.envoyproxy.io":
		return "envoyextensionpolicies.yaml"
	case "extensions.istio.io", "networking.istio.io":
		return "istio.yaml"
	}
	return ""
}

func adminClient(t testing.TB) client.Client {
	t.Helper()
	c, err := client.New(suite.Env(t).Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ensureNamespace(t testing.TB, c client.Client, name string) {
	t.Helper()
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetName(name)
	if err := c.Create(context.Background(), ns); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
}

// TestDryRun submits every rendered object to the API server with
// server-side dry run: schema validation (OpenAPI for built-in kinds, the
// CRD's structural schema for the rest), defaulting and admission, without
// persisting anything.
func TestDryRun(t *testing.T) {
	c := adminClient(t)
	ensureNamespace(t, c, releaseNamespace)
	ensureNamespace(t, c, "istio-system")
	files, err := filepath.Glob(filepath.Join(chartDir(t), "ci", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no value sets: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			for _, o := range mustRender(t, filepath.Base(f)) {
				if crd := crdFor(o.GroupVersionKind()); crd != "" && !crdFiles[crd] {
					if k8stest.Required() {
						t.Fatalf("%s: CRD %s missing: run scripts/envtest.sh", o.GetKind(), crd)
					}
					t.Logf("%s not validated: CRD %s not installed", o.GetKind(), crd)
					continue
				}
				if err := c.Create(context.Background(), o, client.DryRunAll); err != nil {
					t.Errorf("%s %s/%s rejected: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
		})
	}
}

// TestDryRunCatchesErrors shows the dry run validates: objects broken past
// the chart's own checks are refused by the schemas.
func TestDryRunCatchesErrors(t *testing.T) {
	c := adminClient(t)
	ensureNamespace(t, c, releaseNamespace)
	ensureNamespace(t, c, "istio-system")
	tests := []struct {
		values string
		kind   string
		path   []string
		value  any
	}{
		{"default-values.yaml", "InferencePool", []string{"spec", "endpointPickerRef", "failureMode"}, "Sometimes"},
		{"default-values.yaml", "Deployment", []string{"spec", "replicas"}, "two"},
		{"envoy-gateway-values.yaml", "EnvoyExtensionPolicy", []string{"spec", "extProc"}, "not-a-list"},
		{"istio-values.yaml", "WasmPlugin", []string{"spec", "phase"}, "WHENEVER"},
	}
	for _, tc := range tests {
		t.Run(tc.kind, func(t *testing.T) {
			o := find(t, mustRender(t, tc.values), tc.kind)
			if crd := crdFor(o.GroupVersionKind()); crd != "" && !crdFiles[crd] {
				t.Skipf("CRD %s not installed", crd)
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

// TestChartRBACRunsDiscovery installs the chart's ServiceAccount, Role,
// RoleBinding and InferencePool for real and runs discovery as that service
// account: the namespaced Role is all the picker needs, and it grants
// nothing outside the namespace.
func TestChartRBACRunsDiscovery(t *testing.T) {
	c := adminClient(t)
	ensureNamespace(t, c, releaseNamespace)
	ensureNamespace(t, c, "elsewhere")
	objs := mustRender(t, "default-values.yaml")
	var sa, pool string
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "InferencePool":
			if err := c.Create(context.Background(), o); err != nil {
				t.Fatalf("creating %s: %v", o.GetKind(), err)
			}
			if o.GetKind() == "ServiceAccount" {
				sa = o.GetName()
			}
			if o.GetKind() == "InferencePool" {
				pool = o.GetName()
			}
		}
	}
	cfg := suite.Env(t).ServiceAccountConfig(releaseNamespace, sa)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-0", Namespace: releaseNamespace, Labels: map[string]string{"app": "vllm"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	if err := c.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{
		PodIP:      "10.9.0.1",
		PodIPs:     []corev1.PodIP{{IP: "10.9.0.1"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
	}
	if err := c.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}

	d, err := k8s.New(k8s.Options{PoolName: pool, PoolNamespace: releaseNamespace, RestConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan []endpoints.Spec, 16)
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, func(s []endpoints.Spec) error {
			got <- s
			return nil
		})
	}()
	for found := false; !found; {
		select {
		case s := <-got:
			found = len(s) == 1 && s[0].Address == "10.9.0.1:8000"
		case err := <-done:
			t.Fatalf("discovery as %s stopped: %v", sa, err)
		case <-ctx.Done():
			t.Fatal("the chart's service account never discovered the pod")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}

	asSA, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The objective and rewrite APIs of both groups are readable in the
	// release namespace (where their CRDs are installed here).
	for _, gvk := range []schema.GroupVersionKind{
		{Group: "llm-d.ai", Version: "v1alpha2", Kind: "InferenceObjectiveList"},
		{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Kind: "InferenceObjectiveList"},
		{Group: "llm-d.ai", Version: "v1alpha2", Kind: "InferenceModelRewriteList"},
		{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Kind: "InferenceModelRewriteList"},
	} {
		file := map[string]string{"llm-d.ai": "llm-d.ai_", "inference.networking.x-k8s.io": ""}[gvk.Group] + strings.ToLower(strings.TrimSuffix(gvk.Kind, "List")) + "s.yaml"
		if !crdFiles[file] {
			t.Logf("%s not installed (%s missing): run scripts/envtest.sh", gvk.GroupVersion(), file)
			continue
		}
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk)
		if err := asSA.List(context.Background(), list, client.InNamespace(releaseNamespace)); err != nil {
			t.Errorf("listing %s as the picker: %v", gvk, err)
		}
	}
	for _, ns := range []string{"elsewhere", ""} {
		err := asSA.List(context.Background(), &corev1.PodList{}, client.InNamespace(ns))
		if !apierrors.IsForbidden(err) {
			t.Errorf("listing pods in %q as the picker: %v, want forbidden", ns, err)
		}
	}
}

// The upstream charts' own values files (unedited, testdata/upstream)
// install with kvgate's chart: the schema knows every key they set, and
// the objects pass the API server's dry run.
func TestUpstreamValuesFiles(t *testing.T) {
	c := adminClient(t)
	ensureNamespace(t, c, releaseNamespace)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	up := func(name string) string {
		p, err := filepath.Abs(filepath.Join("testdata", "upstream", name))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// routerlib's values are the router: subchart's defaults.
	routerlib, err := os.ReadFile(up("llm-d-routerlib-v0.9.0-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var nested strings.Builder
	nested.WriteString("router:\n")
	for _, l := range strings.Split(string(routerlib), "\n") {
		nested.WriteString("  " + l + "\n")
	}
	tests := []struct {
		name  string
		files []string
		// pool is what the rendered InferencePool must select.
		pool string
	}{
		{"GIE v1.5 values.yaml", []string{up("gie-v1.5.0-values.yaml"), write("gie-sel.yaml", "inferencePool:\n  modelServers:\n    matchLabels:\n      app: vllm-qwen\n")}, "app:vllm-qwen"},
		{"llm-d-router v0.9 values.yaml", []string{write("routerlib.yaml", nested.String()), up("llm-d-router-v0.9.0-values.yaml"),
			write("llmd-sel.yaml", "router:\n  modelServers:\n    matchLabels:\n      app: vllm-qwen\n")}, "app:vllm-qwen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// A name of its own: dry runs collide with objects other
			// tests created.
			args := []string{"--set", "fullnameOverride=upstream-values"}
			for _, f := range tc.files {
				args = append(args, "--values", f)
			}
			objs, err := renderArgs(t, "", args...)
			if err != nil {
				t.Fatal(err)
			}
			checkCommon(t, objs)
			pool := find(t, objs, "InferencePool")
			if got := str(t, pool, "spec", "selector"); !strings.Contains(got, tc.pool) {
				t.Errorf("selector = %s", got)
			}
			if got := str(t, pool, "spec", "endpointPickerRef", "failureMode"); got != "FailOpen" {
				t.Errorf("failureMode = %s", got)
			}
			for _, o := range objs {
				if err := c.Create(context.Background(), o, client.DryRunAll); err != nil {
					t.Errorf("%s %s rejected: %v", o.GetKind(), o.GetName(), err)
				}
			}
		})
	}
}
