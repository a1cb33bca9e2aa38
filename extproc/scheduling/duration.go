package scheduling

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Duration is a plugin parameter holding a duration, written as Go and
// Kubernetes configs write them ("5m", "250ms") or as a number of seconds.
type Duration time.Duration

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil // keep the default, as encoding/json does for other types
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("duration: want a string like %q or a number of seconds, got %s", "5m", b)
	}
	// Out of int64's range a float's conversion is the platform's choice
	// (MinInt64 on amd64: a huge timeout read as a negative one).
	ns := secs * float64(time.Second)
	if !(ns >= math.MinInt64 && ns < math.MaxInt64) {
		return fmt.Errorf("duration: %s seconds is out of range", b)
	}
	*d = Duration(ns)
	return nil
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}
