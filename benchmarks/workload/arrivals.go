package workload

import (
	"fmt"
	"time"
)

// QuantizeArrivals floors every arrival to a multiple of q, so that all the
// requests of one quantum arrive at once: a trace's smooth arrivals become
// the bursts that a batching client or a cron job sends, which is what
// makes policies acting on stale load metrics herd onto one server. It
// returns a new slice in arrival order, keeping the given order among equal
// arrivals; q <= 0 leaves the arrivals unchanged.
func QuantizeArrivals(reqs []Request, q time.Duration) []Request {
	out := make([]Request, len(reqs))
	copy(out, reqs)
	if q <= 0 {
		return out
	}
	for i := range out {
		out[i].Arrival -= out[i].Arrival % q
	}
	// Flooring keeps sorted input sorted; sorting covers input that was not.
	sortByArrival(out)
	return out
}

// checkBurst validates a generator's burst size; 0 means 1.
func checkBurst(n int) (int, error) {
	switch {
	case n == 0:
		return 1, nil
	case n < 0 || n > maxGenerated/2:
		return 0, fmt.Errorf("%w: burst size %d", ErrWorkload, n)
	}
	return n, nil
}
