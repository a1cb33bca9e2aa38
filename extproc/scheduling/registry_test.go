package scheduling

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/duration"
)

// TestDecodeParamsNamesTheParameter: an error a field's own UnmarshalJSON
// returns (a duration's) names the parameter it was decoding, as the
// decoder's own type and unknown-field errors do.
func TestDecodeParamsNamesTheParameter(t *testing.T) {
	type params struct {
		Timeout  duration.Duration `json:"timeout"`
		Interval duration.Duration `json:"interval"`
		Name     string            `json:"name"`
	}
	tests := []struct {
		raw  string
		want string // in the error; "" for none
	}{
		{``, ""},
		{`{"timeout": "5s", "interval": 2, "name": "x"}`, ""},
		{`{"timeout": "5s", "interval": "ten"}`, `parameters.interval: duration "ten"`},
		{`{"interval": "ten", "timeout": "eleven"}`, "parameters.interval: "},
		{`{"timeout": 1e10}`, "parameters.timeout: duration: 1e10 seconds is out of range"},
		{`{"timeout": -1e300}`, "parameters.timeout: "},
		{`{"name": 3}`, "parameters.name: "},
		{`{"nmae": "x"}`, `parameters: json: unknown field "nmae"`},
		{`{"timeout": `, "parameters: "},
	}
	for _, tt := range tests {
		var p params
		err := DecodeParams(json.RawMessage(tt.raw), &p)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.raw, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: error %v, want one with %q", tt.raw, err, tt.want)
		}
	}
}

// FuzzDecodeParams: any input decodes or fails with an error that says it
// is the parameters' (naming one of the input's keys when it names one).
func FuzzDecodeParams(f *testing.F) {
	for _, s := range []string{``, `null`, `{}`, `{"timeout": "5s"}`, `{"timeout": "x", "name": 1}`, `{"a": {"b": [1, 2]}}`, `[1]`, `{"timeout": 1e400}`, `{"timeout"`} {
		f.Add(s)
	}
	type params struct {
		Timeout duration.Duration `json:"timeout"`
		Name    string            `json:"name"`
		Nested  map[string]string `json:"nested"`
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var p params
		err := DecodeParams(json.RawMessage(raw), &p)
		if err == nil {
			return
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "parameters") {
			t.Fatalf("%q: error %q", raw, msg)
		}
		// (A key spelt with escapes is named decoded.)
		if name, ok := strings.CutPrefix(msg, "parameters."); ok && !strings.Contains(raw, `\`) {
			name, _, _ = strings.Cut(name, ": ")
			if !strings.Contains(raw, name) {
				t.Fatalf("%q: error names %q, not in the input", raw, name)
			}
		}
	})
}
