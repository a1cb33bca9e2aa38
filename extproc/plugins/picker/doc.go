// Package picker holds the pickers that turn scored candidates into targets:
// max-score-picker, random-picker, weighted-random-picker and
// round-robin-picker.
//
// Parameters (every picker):
//
//	maxNumOfEndpoints: int  targets returned, primary first then fallbacks (default 1)
package picker

import (
	"fmt"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Params are the pickers' parameters.
type Params struct {
	MaxNumOfEndpoints int `json:"maxNumOfEndpoints"`
}

// base is what every picker has: its identity, how many targets it
// returns, and its randomness.
type base struct {
	scheduling.Named
	n    int
	rand scheduling.Rand
}

func newBase(typ, name string, raw []byte, h *scheduling.Handle) (base, error) {
	p := Params{MaxNumOfEndpoints: 1}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return base{}, err
	}
	if p.MaxNumOfEndpoints < 1 {
		return base{}, fmt.Errorf("parameters.maxNumOfEndpoints must be at least 1, got %d", p.MaxNumOfEndpoints)
	}
	return base{Named: scheduling.NewNamed(typ, name), n: p.MaxNumOfEndpoints, rand: scheduling.RandOf(h)}, nil
}

func targets(cs *scheduling.CycleState, scored []scheduling.ScoredEndpoint, n int) *scheduling.ProfileResult {
	n = min(n, len(scored))
	res := scheduling.NewProfileResult(cs, n)
	for i := range n {
		res.Targets[i] = scored[i].Endpoint
	}
	return res
}
