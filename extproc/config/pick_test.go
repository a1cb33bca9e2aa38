package config

import (
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// The hot path allocates nothing per decision: the cycle state, the
// results and every plugin's per-request state are recycled when the
// request ends, so a burst of decisions brings no garbage collection
// (which set BenchmarkPick's p99). What remains of the precise profile's
// request life is its latency model learning from the response: each
// observed TTFT and TPOT publishes a new fit of the pool and of the
// endpoint, one immutable snapshot each (extproc/latency), off the
// decision.
func TestPickAllocations(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates and drops pooled items")
	}
	for _, tc := range []struct {
		profile string
		// life is the allocations of a whole request (decision, first
		// token, completion).
		life float64
	}{
		{profile: "default", life: 0},
		{profile: PolicyPrecise, life: 4},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			p := newPicking(t, tc.profile, 64)
			i := 0
			next := func() { i = (i + 1) % len(p.reqs) }
			decision := testing.AllocsPerRun(200, func() {
				r := p.reqs[i]
				next()
				cs := p.decide(r)
				cs.Release()
			})
			if decision != 0 {
				t.Errorf("%v allocations per decision, want 0", decision)
			}
			life := testing.AllocsPerRun(200, func() {
				p.pick(p.reqs[i])
				next()
			})
			if life > tc.life {
				t.Errorf("%v allocations per request, want at most %v", life, tc.life)
			}
		})
	}
}
