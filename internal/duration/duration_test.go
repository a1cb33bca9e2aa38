package duration

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

// bad marks a reading that must be an error.
const bad = time.Duration(math.MinInt64)

func TestDecode(t *testing.T) {
	tests := []struct {
		raw     string
		seconds time.Duration // Duration's reading, or bad
		nanos   time.Duration // Nanos' reading, or bad
		err     string        // in both errors, where both fail
	}{
		{`"250ms"`, 250 * time.Millisecond, 250 * time.Millisecond, ""},
		{`"5m"`, 5 * time.Minute, 5 * time.Minute, ""},
		{`"-1s"`, -time.Second, -time.Second, ""},
		{`2`, 2 * time.Second, 2, ""},
		{`0.5`, 500 * time.Millisecond, bad, ""},
		{`60000000000`, bad, time.Minute, ""},
		{`1e10`, bad, bad, ""},
		{`"ten"`, bad, bad, `duration "ten"`},
		{`true`, bad, bad, "want a string"},
		{`{}`, bad, bad, "want a string"},
	}
	for _, tt := range tests {
		var s Duration
		errS := json.Unmarshal([]byte(tt.raw), &s)
		var n Nanos
		errN := json.Unmarshal([]byte(tt.raw), &n)
		check := func(kind string, got, want time.Duration, err error) {
			t.Helper()
			switch {
			case want == bad && err == nil:
				t.Errorf("%s %s: got %v, want an error", kind, tt.raw, got)
			case want != bad && err != nil:
				t.Errorf("%s %s: %v", kind, tt.raw, err)
			case want != bad && got != want:
				t.Errorf("%s %s: got %v, want %v", kind, tt.raw, got, want)
			case err != nil && tt.err != "" && !strings.Contains(err.Error(), tt.err):
				t.Errorf("%s %s: error %q, want it to say %q", kind, tt.raw, err, tt.err)
			}
		}
		check("Duration", time.Duration(s), tt.seconds, errS)
		check("Nanos", time.Duration(n), tt.nanos, errN)
	}
}

// TestNullKeepsTheDefault: a field written as null keeps the value it had.
func TestNullKeepsTheDefault(t *testing.T) {
	p := struct {
		A Duration `json:"a"`
		B Nanos    `json:"b"`
	}{Duration(time.Minute), Nanos(time.Hour)}
	if err := json.Unmarshal([]byte(`{"a": null, "b": null}`), &p); err != nil {
		t.Fatal(err)
	}
	if time.Duration(p.A) != time.Minute || time.Duration(p.B) != time.Hour {
		t.Fatalf("null replaced the defaults: %v, %v", time.Duration(p.A), time.Duration(p.B))
	}
}

// TestRoundTrip: what either type writes, both read back as the same value.
func TestRoundTrip(t *testing.T) {
	for _, d := range []time.Duration{0, time.Nanosecond, 1500 * time.Microsecond, -3 * time.Hour} {
		b, err := json.Marshal(Duration(d))
		if err != nil {
			t.Fatal(err)
		}
		var s Duration
		var n Nanos
		if json.Unmarshal(b, &s) != nil || json.Unmarshal(b, &n) != nil || time.Duration(s) != d || time.Duration(n) != d {
			t.Errorf("%v wrote %s, read back %v and %v", d, b, time.Duration(s), time.Duration(n))
		}
	}
}

// FuzzDuration: a number decodes to the seconds it says (to rounding) or
// to an error, never to a wrapped value of the other sign.
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

// FuzzNanos: an integer decodes to exactly its nanoseconds; anything else
// that is not a duration string is an error.
func FuzzNanos(f *testing.F) {
	for _, s := range []string{`"5m"`, `60000000000`, `-1`, `1.5`, `1e3`, `99999999999999999999`, `null`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var d Nanos
		if err := d.UnmarshalJSON([]byte(raw)); err != nil {
			return
		}
		var n int64
		if json.Unmarshal([]byte(raw), &n) == nil && time.Duration(d) != time.Duration(n) {
			t.Fatalf("%s nanoseconds decoded as %d", raw, int64(d))
		}
	})
}
