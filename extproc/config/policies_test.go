package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
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
