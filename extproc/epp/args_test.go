package epp

import (
	"io"
	"log/slog"
	"reflect"
	"testing"
	"time"
)

// A command line built from Options parses back to the same Options.
func TestArgsRoundTrip(t *testing.T) {
	full := Options{
		ConfigText: "kind: EndpointPickerConfig", EndpointsFile: "/tmp/eps.yaml",
		GRPCAddr: "127.0.0.1:1", HealthAddr: "127.0.0.1:2", MetricsAddr: "127.0.0.1:3",
		RefreshMetricsInterval: 50 * time.Millisecond, PoolName: "p", PoolNamespace: "ns",
		Kubeconfig: "/k", KVEventsAddr: "tcp://127.0.0.1:4", TrustFilterHeaders: true,
		MaxRequestBodyBytes: 123, DrainTimeout: 2 * time.Second, LogLevel: slog.LevelDebug,
	}
	k8s := DefaultOptions()
	k8s.ConfigFile, k8s.EndpointSelector, k8s.EndpointTargetPorts = "/c.yaml", "app=vllm", []int{8000, 8001}
	for _, o := range []Options{DefaultOptions(), full, k8s} {
		got, err := ParseFlags(o.Args(), io.Discard)
		if err != nil {
			t.Fatalf("ParseFlags(%q): %v", o.Args(), err)
		}
		if !reflect.DeepEqual(got, o) {
			t.Fatalf("ParseFlags(%q) =\n%+v, want\n%+v", o.Args(), got, o)
		}
	}
	// Every flag field is covered: the full options set each one.
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		switch name := v.Type().Field(i).Name; name {
		case "ConfigFile", "EndpointSelector", "EndpointTargetPorts": // exclusive with the above; set in k8s
		default:
			if v.Field(i).IsZero() {
				t.Errorf("field %s not set in the round-trip options", name)
			}
		}
	}
}
