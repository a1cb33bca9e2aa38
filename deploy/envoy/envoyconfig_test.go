package envoyconfig_test

import (
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	// Every other typed_config in the bootstraps must resolve too.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "google.golang.org/protobuf/types/known/wrapperspb"
)

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// validateAnys unpacks every Any below m and validates its contents:
// Bootstrap.ValidateAll checks an Any's type URL but not what is inside.
func validateAnys(t *testing.T, m protoreflect.Message, path string) {
	t.Helper()
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			t.Errorf("%s: %v", path, err)
			return
		}
		if v, ok := inner.(validator); ok {
			if err := v.ValidateAll(); err != nil {
				t.Errorf("%s (%s): %v", path, a.GetTypeUrl(), err)
			}
		}
		validateAnys(t, inner.ProtoReflect(), path+"<"+a.GetTypeUrl()+">")
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				validateAnys(t, v.List().Get(i).Message(), p)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				validateAnys(t, mv.Message(), p)
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			validateAnys(t, v.Message(), p)
		}
		return true
	})
}

func TestBootstraps(t *testing.T) {
	for name, body := range map[string]extprocv3.ProcessingMode_BodySendMode{
		"envoy.yaml":           extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		"envoy-fast-path.yaml": extprocv3.ProcessingMode_NONE,
	} {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			js, err := yaml.YAMLToJSON(raw)
			if err != nil {
				t.Fatal(err)
			}
			var b bootstrapv3.Bootstrap
			// Strict: unknown fields and unresolvable Any types are errors.
			if err := (protojson.UnmarshalOptions{}).Unmarshal(js, &b); err != nil {
				t.Fatalf("parse: %v", err)
			}
			if err := b.ValidateAll(); err != nil {
				t.Fatalf("validate: %v", err)
			}
			validateAnys(t, b.ProtoReflect(), "bootstrap")
			checkPicker(t, &b, body)
		})
	}
}

// checkPicker pins the parts the picker protocol depends on.
func checkPicker(t *testing.T, b *bootstrapv3.Bootstrap, wantBody extprocv3.ProcessingMode_BodySendMode) {
	t.Helper()
	var origDst bool
	for _, c := range b.GetStaticResources().GetClusters() {
		if lb := c.GetOriginalDstLbConfig(); lb != nil {
			origDst = lb.GetUseHttpHeader() && lb.GetHttpHeaderName() == "x-gateway-destination-endpoint"
		}
	}
	if !origDst {
		t.Error("no ORIGINAL_DST cluster routing on x-gateway-destination-endpoint")
	}
	var filters []string
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatalf("%s: %v", f.GetName(), err)
				}
				for _, hf := range hcm.GetHttpFilters() {
					filters = append(filters, hf.GetName())
					var ep extprocv3.ExternalProcessor
					var wasm wasmv3.Wasm
					switch {
					case hf.GetTypedConfig().MessageIs(&ep):
						if err := hf.GetTypedConfig().UnmarshalTo(&ep); err != nil {
							t.Fatal(err)
						}
						pm := ep.GetProcessingMode()
						if ep.GetFailureModeAllow() || ep.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "kvgate-epp" ||
							pm.GetRequestHeaderMode() != extprocv3.ProcessingMode_SEND ||
							pm.GetRequestBodyMode() != wantBody ||
							pm.GetResponseBodyMode() != extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED {
							t.Errorf("ext_proc config: %v", &ep)
						}
					case hf.GetTypedConfig().MessageIs(&wasm):
						if err := hf.GetTypedConfig().UnmarshalTo(&wasm); err != nil {
							t.Fatal(err)
						}
						if wasm.GetConfig().GetVmConfig().GetRuntime() != "envoy.wasm.runtime.v8" {
							t.Errorf("wasm runtime %q", wasm.GetConfig().GetVmConfig().GetRuntime())
						}
					}
				}
			}
		}
	}
	want := "envoy.filters.http.wasm,envoy.filters.http.ext_proc,envoy.filters.http.router"
	if got := strings.Join(filters, ","); got != want {
		t.Errorf("http filters %s, want %s", got, want)
	}
}

// TestKubernetesExamples checks the Envoy Gateway and Istio examples are
// well-formed YAML documents of the expected kinds.
func TestKubernetesExamples(t *testing.T) {
	for file, kinds := range map[string][]string{
		"envoy-gateway-extension-policy.yaml": {"EnvoyExtensionPolicy"},
		"istio-wasmplugin.yaml":               {"WasmPlugin", "EnvoyFilter"},
	} {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, doc := range strings.Split(string(raw), "\n---\n") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var obj struct {
				APIVersion string         `json:"apiVersion"`
				Kind       string         `json:"kind"`
				Metadata   map[string]any `json:"metadata"`
				Spec       map[string]any `json:"spec"`
			}
			if err := yaml.UnmarshalStrict([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if obj.APIVersion == "" || obj.Metadata["name"] == nil || len(obj.Spec) == 0 {
				t.Fatalf("%s: incomplete %s", file, obj.Kind)
			}
			got = append(got, obj.Kind)
		}
		if strings.Join(got, ",") != strings.Join(kinds, ",") {
			t.Errorf("%s: kinds %v, want %v", file, got, kinds)
		}
	}
}
