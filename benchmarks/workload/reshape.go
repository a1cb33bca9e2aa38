package workload

import (
	"fmt"
	"math"
	"time"
)

// Reshape varies a workload's arrival rate over time: during stage i (each
// lasting each) the workload is replayed at factors[i] times its own pace,
// so a trace's mix of requests is kept while its load steps up and down
// (a stepped or diurnal profile). Requests the stages do not reach are
// dropped; OfferedQPS is multiplied by the stage's factor. It returns a new
// slice.
func Reshape(reqs []Request, factors []float64, each time.Duration) ([]Request, error) {
	if len(factors) == 0 || each <= 0 {
		return nil, fmt.Errorf("%w: a rate profile needs stages and a positive stage duration", ErrWorkload)
	}
	for _, f := range factors {
		if !(f > 0) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%w: rate factor %v must be positive", ErrWorkload, f)
		}
	}
	out := make([]Request, 0, len(reqs))
	// Stage i replays the workload's time [consumed, consumed+f·each).
	stage, consumed := 0, time.Duration(0)
	for _, r := range reqs {
		for stage < len(factors) && r.Arrival >= consumed+time.Duration(factors[stage]*float64(each)) {
			consumed += time.Duration(factors[stage] * float64(each))
			stage++
		}
		if stage == len(factors) {
			break
		}
		f := factors[stage]
		r.Arrival = time.Duration(stage)*each + time.Duration(float64(r.Arrival-consumed)/f)
		if r.OfferedQPS > 0 {
			r.OfferedQPS *= f
		}
		out = append(out, r)
	}
	return out, nil
}
