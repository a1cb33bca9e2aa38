package defaults

import "time"

// Duration is the configured d: def when d is zero (unset), 0 (none) when
// d is negative, d otherwise.
func Duration(d, def time.Duration) time.Duration {
	switch {
	case d < 0:
		return 0
	case d == 0:
		return def
	}
	return d
}
