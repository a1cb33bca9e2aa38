package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// The generated configurations parse to hand-written references
// (testdata/policies): the previous generator's output for the GIE
// baselines, and kvgate's live-model profile for precise.
func TestPolicyMatchesReference(t *testing.T) {
	sets := map[string]PolicyOptions{
		"plain": {},
		"demo":  {Tokenizer: "/tmp/tok dir/qwen3", BlockSize: 16, HashSeed: "42", Fallbacks: 1},
		"bench": {BlockSize: 16, HashSeed: "42"},
	}
	for set, o := range sets {
		for _, name := range PolicyNames {
			ref, err := os.ReadFile(filepath.Join("testdata", "policies", name+"."+set+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			raw, err := Policy(name, o)
			if err != nil {
				t.Fatal(err)
			}
			want, err := Parse(ref)
			if err != nil {
				t.Fatalf("%s/%s reference: %v", name, set, err)
			}
			got, err := Parse(raw)
			if err != nil {
				t.Fatalf("%s/%s: %v\n%s", name, set, err, raw)
			}
			if !reflect.DeepEqual(normalized(t, got), normalized(t, want)) {
				t.Errorf("%s/%s: got\n%s\nwant\n%s", name, set, raw, ref)
			}
		}
	}
}

// normalized decodes every raw parameter block, so that key order and
// spacing inside it do not count.
func normalized(t *testing.T, c *Config) any {
	t.Helper()
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(js, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// A policy under flow control builds the layer with the detector, the
// holdback policy and the TTL it names; without a holdback ceiling it is
// strict priority only; out-of-range values are refused.
func TestPolicyWithFlowControl(t *testing.T) {
	for _, tc := range []struct {
		fc       PolicyFlowControl
		holdback bool
		wantErr  bool
	}{
		{fc: PolicyFlowControl{MaxConcurrency: 40, HoldbackMinCeiling: 0.5, RequestTTL: 20 * time.Second}, holdback: true},
		{fc: PolicyFlowControl{MaxConcurrency: 8}},
		{fc: PolicyFlowControl{MaxConcurrency: 0}, wantErr: true},
		{fc: PolicyFlowControl{MaxConcurrency: 8, HoldbackMinCeiling: 1}, wantErr: true},
	} {
		for _, name := range []string{PolicyLoad, PolicyPrecise} {
			raw, err := Policy(name, PolicyOptions{FlowControl: &tc.fc})
			if tc.wantErr {
				if err == nil {
					t.Errorf("%s %+v accepted", name, tc.fc)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s %+v: %v", name, tc.fc, err)
			}
			c, err := Parse(raw)
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, raw)
			}
			h := &scheduling.Handle{Services: precise.WithKVIndex(nil, kvindex.New(kvindex.Config{}))}
			built, err := Build(c, all.Registry(), h, nil)
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, raw)
			}
			if built.FlowControl == nil || built.FlowControl.Detector == nil {
				t.Fatalf("%s: no flow-control layer built from\n%s", name, raw)
			}
			if tc.fc.RequestTTL > 0 && built.FlowControl.Config.RequestTTL != tc.fc.RequestTTL {
				t.Errorf("%s: TTL %v, want %v", name, built.FlowControl.Config.RequestTTL, tc.fc.RequestTTL)
			}
			if got := strings.Contains(string(raw), "priority-holdback-policy"); got != tc.holdback {
				t.Errorf("%s: holdback in config %v, want %v\n%s", name, got, tc.holdback, raw)
			}
		}
	}
}
