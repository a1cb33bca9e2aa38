package defaults

import (
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	const def = time.Minute
	for _, c := range []struct {
		d, want time.Duration
	}{
		{0, def},
		{-1, 0},
		{-time.Hour, 0},
		{time.Nanosecond, time.Nanosecond},
		{2 * time.Hour, 2 * time.Hour},
	} {
		if got := Duration(c.d, def); got != c.want {
			t.Errorf("Duration(%v, %v) = %v, want %v", c.d, def, got, c.want)
		}
	}
}
