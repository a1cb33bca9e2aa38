package duration

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Duration is a configured duration: a Go duration string or a number of
// seconds.
type Duration time.Duration

// Nanos is a configured duration: a Go duration string or an integer of
// nanoseconds.
type Nanos time.Duration

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	return decode(b, (*time.Duration)(d), time.Second)
}

// MarshalJSON writes the duration string, which both types read back.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Nanos) UnmarshalJSON(b []byte) error {
	return decode(b, (*time.Duration)(d), time.Nanosecond)
}

// MarshalJSON writes the duration string, which both types read back.
func (d Nanos) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// decode reads b into d, a number counting units. null keeps d, as
// encoding/json does for other types, so a field's default survives.
func decode(b []byte, d *time.Duration, unit time.Duration) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(b, &s) == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = v
		return nil
	}
	if unit == time.Nanosecond {
		// An integer, as a time.Duration marshals: a fraction of a
		// nanosecond means the writer had another unit in mind.
		n, err := strconv.ParseInt(string(b), 10, 64)
		if err != nil {
			return fmt.Errorf("duration: want a string like %q or an integer of nanoseconds, got %s", "5m", b)
		}
		*d = time.Duration(n)
		return nil
	}
	var n float64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration: want a string like %q or a number of seconds, got %s", "5m", b)
	}
	// Out of int64's range a float's conversion is the platform's choice
	// (MinInt64 on amd64: a huge timeout read as a negative one).
	ns := n * float64(unit)
	if !(ns >= math.MinInt64 && ns < math.MaxInt64) {
		return fmt.Errorf("duration: %s seconds is out of range", b)
	}
	*d = time.Duration(ns)
	return nil
}
