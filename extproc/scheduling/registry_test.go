package scheduling

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestDecodeParamsNamesTheParameter: an error a field's own UnmarshalJSON
// returns (a duration's) names the parameter it was decoding, as the
// decoder's own type and unknown-field errors do.
func TestDecodeParamsNamesTheParameter(t *testing.T) {
	type params struct {
		Timeout  Duration `json:"timeout"`
		Interval Duration `json:"interval"`
		Name     string   `json:"name"`
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

// FuzzDuration: whatever the input, a decoded duration is the seconds it
// says (to a nanosecond's rounding) or an error, never a wrapped value.
func FuzzDuration(f *testing.F) {
	for _, s := range []string{`"5m"`, `2.5`, `-1`, `1e10`, `9.2e9`, `-9.3e9`, `"x"`, `null`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var d Duration
		if err := d.UnmarshalJSON([]byte(raw)); err != nil {
			return
		}
		var secs float64
		if json.Unmarshal([]byte(raw), &secs) == nil {
			if got := time.Duration(d).Seconds(); (secs > 1 || secs < -1) && (got > 0) != (secs > 0) {
				t.Fatalf("%s seconds decoded as %v", raw, time.Duration(d))
			}
		}
	})
}
