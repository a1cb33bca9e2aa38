package k8s

import (
	"errors"
	"reflect"
	"testing"
)

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name      string
		opts      Options
		wantErr   bool
		wantSel   string
		wantPorts []int
	}{
		{name: "pool", opts: Options{PoolName: "p"}},
		{name: "selector", opts: Options{EndpointSelector: "app=vllm,tier!=canary", TargetPorts: []int{8000, 8001}},
			wantSel: "app=vllm,tier!=canary", wantPorts: []int{8000, 8001}},
		{name: "neither", opts: Options{}, wantErr: true},
		{name: "both", opts: Options{PoolName: "p", EndpointSelector: "app=x", TargetPorts: []int{1}}, wantErr: true},
		{name: "pool with ports", opts: Options{PoolName: "p", TargetPorts: []int{8000}}, wantErr: true},
		{name: "selector without ports", opts: Options{EndpointSelector: "app=x"}, wantErr: true},
		{name: "bad selector", opts: Options{EndpointSelector: "app in (a", TargetPorts: []int{1}}, wantErr: true},
		{name: "everything selector", opts: Options{EndpointSelector: " ", TargetPorts: []int{1}}, wantErr: true},
		{name: "port out of range", opts: Options{EndpointSelector: "app=x", TargetPorts: []int{70000}}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.opts.validate()
			if tc.wantErr {
				if !errors.Is(err, ErrInvalidOptions) {
					t.Fatalf("err = %v, want ErrInvalidOptions", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			sel := ""
			if got.selector != nil {
				sel = got.selector.String()
			}
			if sel != tc.wantSel || !reflect.DeepEqual(got.ports, tc.wantPorts) {
				t.Errorf("target = %q %v, want %q %v", sel, got.ports, tc.wantSel, tc.wantPorts)
			}
		})
	}
}

// FuzzEndpointSelector feeds arbitrary --endpoint-selector values through
// option validation: it must reject or accept, never panic, and an accepted
// selector must select something narrower than everything.
func FuzzEndpointSelector(f *testing.F) {
	for _, s := range []string{"app=vllm", "app in (a,b),!canary", "a!=b", "x", "", "=", "a=(", "a notin ()"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o := Options{EndpointSelector: s, TargetPorts: []int{8000}}
		got, err := o.validate()
		if err == nil && (got.selector == nil || got.selector.Empty()) {
			t.Fatalf("selector %q accepted but selects everything", s)
		}
	})
}
