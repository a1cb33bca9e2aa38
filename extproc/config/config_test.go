package config

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func build(t *testing.T, yaml string) (*Built, error) {
	t.Helper()
	c, err := Parse([]byte(yaml))
	if err != nil {
		return nil, err
	}
	return Build(c, all.Registry(), &scheduling.Handle{}, nil)
}

type profileShape struct {
	filters int
	scorers map[string]float64 // plugin name → weight
	picker  string
}

func shape(p *scheduling.Profile) profileShape {
	s := profileShape{filters: len(p.Filters), scorers: map[string]float64{}, picker: p.Picker.TypedName().Type}
	for _, ws := range p.Scorers {
		s.scorers[ws.TypedName().Name] = ws.Weight
	}
	return s
}

func TestExampleConfigsLoad(t *testing.T) {
	tests := []struct {
		file     string
		want     profileShape
		hooks    int // PreRequest hooks
		queueThr int
	}{
		{"", profileShape{0, map[string]float64{"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3}, "max-score-picker"}, 1, 5},
		{"gie-default.yaml", profileShape{0, map[string]float64{"queue-scorer": 1, "kv-cache-utilization-scorer": 1, "prefix-cache-scorer": 3}, "max-score-picker"}, 1, 8},
		{"gie-minimal.yaml", profileShape{0, map[string]float64{"prefix-cache-scorer": 50}, "max-score-picker"}, 1, 5},
		{"llm-d-decode.yaml", profileShape{1, map[string]float64{"prefix-cache-scorer": 2, "load-aware-scorer": 1, "active-request-scorer": 1, "kv-cache-scorer": 1}, "max-score-picker"}, 1, 5},
		{"no-profiles.yaml", profileShape{0, map[string]float64{"queue-scorer": 1, "lora-affinity-scorer": 1}, "weighted-random-picker"}, 0, 5},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = filepath.Join("testdata", tc.file)
			}
			c, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Build(c, all.Registry(), &scheduling.Handle{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			profiles := b.Scheduler.Profiles()
			if len(profiles) != 1 {
				t.Fatalf("%d profiles", len(profiles))
			}
			got := shape(profiles["default"])
			if got.filters != tc.want.filters || got.picker != tc.want.picker || len(got.scorers) != len(tc.want.scorers) {
				t.Fatalf("profile = %+v, want %+v", got, tc.want)
			}
			for n, w := range tc.want.scorers {
				if got.scorers[n] != w {
					t.Fatalf("scorer %s weight %v, want %v (profile %+v)", n, got.scorers[n], w, got)
				}
			}
			if len(b.PreRequest) != tc.hooks {
				t.Fatalf("%d PreRequest hooks, want %d", len(b.PreRequest), tc.hooks)
			}
			if b.Saturation.QueueDepthThreshold != tc.queueThr {
				t.Fatalf("queue threshold %d, want %d", b.Saturation.QueueDepthThreshold, tc.queueThr)
			}
			// The built scheduler works end to end.
			eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{WaitingQueueSize: 9}), schedtest.Endpoint("b", endpoints.Metrics{})}
			res, err := b.Scheduler.Schedule(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, eps)
			if err != nil || res.Primary() == nil {
				t.Fatalf("schedule: %v %v", res, err)
			}
		})
	}
}

func TestSaturationDetectorConfig(t *testing.T) {
	c, err := Load("testdata/gie-default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(c, all.Registry(), &scheduling.Handle{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(b.Saturation.MetricsStalenessThreshold) != 150*time.Millisecond || b.Saturation.KVCacheUtilThreshold != 0.75 {
		t.Fatalf("saturation = %+v", b.Saturation)
	}
	if !b.FeatureGates["dataLayer"] {
		t.Fatal("feature gate lost")
	}
}

// Every configuration error names where it is.
func TestConfigErrors(t *testing.T) {
	const head = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown plugin type", head + "plugins:\n- type: magic-scorer\n", `plugins[0] (name "magic-scorer", type "magic-scorer"): unknown plugin type "magic-scorer"`},
		{"unknown parameter", head + "plugins:\n- type: max-score-picker\n  parameters: {maxEndpoints: 2}\n", `plugins[0] (name "max-score-picker", type "max-score-picker"): parameters: json: unknown field "maxEndpoints"`},
		{"bad parameter value", head + "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 0}\n", "maxNumOfEndpoints must be at least 1"},
		{"missing type", head + "plugins:\n- name: x\n", "plugins[0]: type is required"},
		{"duplicate name", head + "plugins:\n- type: queue-scorer\n- type: queue-scorer\n", `plugins[1]: plugin name "queue-scorer" is used twice`},
		{"dangling ref", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: nope\n", `schedulingProfiles[0].plugins[0].pluginRef: "nope" is not a configured plugin`},
		{"weight on picker", head + "plugins:\n- type: random-picker\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: random-picker\n    weight: 2\n", `schedulingProfiles[0].plugins[0].weight: "random-picker" is not a scorer`},
		{"negative weight", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n    weight: -1\n", "weight: must not be negative"},
		{"two pickers", head + "plugins:\n- type: random-picker\n- type: max-score-picker\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: random-picker\n  - pluginRef: max-score-picker\n", "has a second picker"},
		{"handler in profile", head + "plugins:\n- type: single-profile-handler\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: single-profile-handler\n", "is not a filter, scorer or picker"},
		{"two profiles single handler", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins: [{pluginRef: queue-scorer}]\n- name: b\n  plugins: [{pluginRef: queue-scorer}]\n", "single-profile-handler needs exactly one scheduling profile"},
		{"wrong kind", "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: Pod\n", `kind must be "EndpointPickerConfig"`},
		{"wrong version", "apiVersion: v1\nkind: EndpointPickerConfig\n", "apiVersion must be"},
		{"unknown top-level field", head + "plugin: []\n", `unknown field "plugin"`},
		{"bad saturation", head + "saturationDetector:\n  kvCacheUtilThreshold: 2\n", "kvCacheUtilThreshold must be in (0, 1]"},
		{"bad duration", head + "saturationDetector:\n  metricsStalenessThreshold: soon\n", "invalid duration"},
		{"not yaml", "{{{", "EndpointPickerConfig"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := build(t, tc.yaml)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "none.yaml")); !os.IsNotExist(unwrapAll(err)) {
		t.Fatalf("err = %v", err)
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"gie-default.yaml", "gie-minimal.yaml", "llm-d-decode.yaml", "no-profiles.yaml"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(DefaultYAML))
	upstream, err := filepath.Glob(filepath.Join("testdata", "upstream", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range upstream {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	reg := all.Registry()
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		_, _ = Build(c, reg, &scheduling.Handle{}, nil)
	})
}

// Every named policy builds, and approx is GIE's default profile.
func TestPolicies(t *testing.T) {
	reg := all.Registry()
	h := &scheduling.Handle{Services: map[string]any{precise.ServiceKVIndex: kvindex.New(kvindex.Config{})}}
	for _, name := range PolicyNames {
		raw, err := Policy(name, PolicyOptions{BlockSize: 16, HashSeed: "7", Fallbacks: 1})
		if err != nil {
			t.Fatal(err)
		}
		c, err := Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, raw)
		}
		b, err := Build(c, reg, h, nil)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, raw)
		}
		if name == PolicyApprox {
			got := shape(b.Scheduler.Profiles()["default"])
			if got.scorers["prefix-cache-scorer"] != 3 || got.scorers["queue-scorer"] != 2 || got.scorers["kv-cache-utilization-scorer"] != 2 {
				t.Fatalf("approx profile %+v", got)
			}
		}
	}
	if _, err := Policy("fastest", PolicyOptions{}); err == nil {
		t.Fatal("unknown policy accepted")
	}
}
