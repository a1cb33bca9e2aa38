package all

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/director"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/plugins/flowpolicy"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/telemetry"
)

// Every registered type (and alias) builds with default parameters, and
// nothing is registered twice (Registry would panic).
func TestEveryPluginBuildsWithDefaults(t *testing.T) {
	r := Registry()
	tel, err := telemetry.New(telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := &scheduling.Handle{Services: map[string]any{precise.ServiceKVIndex: kvindex.New(kvindex.Config{}), telemetry.ServiceKey: tel}}
	for _, typ := range r.Types() {
		p, err := r.Build(typ, "", minimalParams(typ, ""), h)
		if err != nil {
			t.Errorf("%s: %v", typ, err)
			continue
		}
		if p.TypedName().Name == "" {
			t.Errorf("%s: empty name", typ)
		}
	}
	var unknown *scheduling.UnknownTypeError
	if _, err := r.Build("nope", "", nil, h); !errors.As(err, &unknown) {
		t.Fatalf("unknown type error = %v", err)
	}
}

// requiredParams are the parameters a plugin cannot be built without (it
// has no sensible default), used wherever the tests build every type.
var requiredParams = map[string]map[string]any{
	"by-label": {"label": "hw", "allowsNoLabel": true},
	// llm-d has no default floor for the holdback ceiling.
	flowpolicy.HoldbackType: {"minCeiling": 0.5},
	// The class counts it reads, and its own ceiling and slope.
	flowpolicy.PresenceType: {"classLoadPluginRef": "class-load-scorer", "ceiling": 0.2, "perProtected": 0.001},
	// The endpoints file (read when the picker runs, not at build).
	"file-discovery":              {"path": "/etc/epp/endpoints.yaml"},
	"multicluster-file-discovery": {"path": "/etc/epp/clusters.yaml"},
	// GIE has no default attribute.
	"request-attribute-reporter": {"attributes": []any{map[string]any{"key": map[string]any{"name": "cost"}, "expression": "usage.completion_tokens"}}},
	// The attribute plugins name their attribute, its producer and an
	// algorithm.
	"endpoint-attribute-filter": {"attribute": "GPUUtilization", "producer": "dcgm-extractor",
		"algorithm": map[string]any{"type": "threshold", "threshold": map[string]any{"operator": "LessThan", "value": 0.9}}},
	"endpoint-attribute-scorer": {"attributeKey": "GPUUtilization", "producer": "dcgm-extractor", "algorithm": map[string]any{"type": "linear_lower_is_better"}},
	// The rollout screener's scope and gating, the affinity's mapping.
	"disaggregatedset-rollout-screener": {"scope": map[string]any{"labelSelector": "set=s"}, "revisionGating": map[string]any{"mode": "disabled"}},
	"header-label-affinity-scorer":      {"headerName": "x-slice", "labelKey": "slice"},
}

// minimalParams is typ's required parameters, with probe (when not empty)
// set to null.
func minimalParams(typ, probe string) json.RawMessage {
	req, ok := requiredParams[typ]
	if !ok && probe == "" {
		return nil
	}
	m := map[string]any{}
	for k, v := range req {
		m[k] = v
	}
	if _, required := m[probe]; probe != "" && !required {
		m[probe] = nil
	}
	raw, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return raw
}

// Every saturation detector a configuration can name at
// saturationDetector.pluginRef is also the director's shedding test
// without flow control, and sheds exactly when its saturation reaches the
// set point: one that is not leaves the picker shedding by GIE's legacy
// thresholds instead of the detector the configuration names.
func TestEveryDetectorSheds(t *testing.T) {
	r := Registry()
	tel, err := telemetry.New(telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := &scheduling.Handle{Now: time.Now, Services: map[string]any{precise.ServiceKVIndex: kvindex.New(kvindex.Config{}), telemetry.ServiceKey: tel}}
	idle := schedtest.Endpoint("idle", endpoints.Metrics{UpdateTime: time.Now()})
	busy := schedtest.Endpoint("busy", endpoints.Metrics{UpdateTime: time.Now()})
	for range 100_000 {
		busy.Charge(0, 1000, 1000, 1000)
	}
	for _, typ := range r.Types() {
		p, err := r.Build(typ, "", minimalParams(typ, ""), h)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		d, ok := p.(flowcontrol.SaturationDetector)
		if _, admitter := p.(scheduling.Admitter); !ok || admitter {
			// probabilistic-admitter measures a saturation of its own
			// to shed by; it is no detector.
			continue
		}
		s, ok := p.(director.Saturation)
		if !ok {
			t.Errorf("%s is a saturation detector but not a director.Saturation", typ)
			continue
		}
		for _, eps := range [][]*endpoints.Endpoint{nil, {idle}, {busy}, {idle, busy}} {
			if got, want := s.Saturated(eps), d.Saturation(eps) >= 1; got != want {
				t.Errorf("%s: Saturated(%d endpoints) = %v, saturation %v", typ, len(eps), got, d.Saturation(eps))
			}
		}
	}
}
