package benchmarks

import (
	"strings"
	"testing"
)

func TestParsePresets(t *testing.T) {
	tests := []struct {
		spec    string
		want    []string
		wantErr string // a substring: the bad entry must be named
	}{
		{"llama-3.1-8b-h100:2,llama-3.1-8b-h200:1", []string{"llama-3.1-8b-h100", "llama-3.1-8b-h100", "llama-3.1-8b-h200"}, ""},
		{" qwen3-0.6b-h100:1 ", []string{"qwen3-0.6b-h100"}, ""},
		{"llama-3.1-8b-h100:2,llama-3.1-8b-h200", nil, `"llama-3.1-8b-h200": want name:count`},
		{"llama-3.1-8b-h100:2,nope:3", nil, `"nope:3": unknown preset`},
		{"llama-3.1-8b-h100:0", nil, `"llama-3.1-8b-h100:0": count`},
		{"llama-3.1-8b-h100:x", nil, `"llama-3.1-8b-h100:x": count`},
		{"llama-3.1-8b-h100:-1", nil, `"llama-3.1-8b-h100:-1": count`},
		{"llama-3.1-8b-h100:99999999", nil, "too many"},
		{"", nil, `"": want`},
	}
	for _, tc := range tests {
		got, err := parsePresets(tc.spec)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err = %v, want %q", tc.spec, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		var names []string
		for _, p := range got {
			names = append(names, p.Name)
		}
		if strings.Join(names, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%q: %v, want %v", tc.spec, names, tc.want)
		}
	}
}
