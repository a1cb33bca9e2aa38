package picker

import (
	"context"
	"encoding/json"
	"math"
	"slices"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

// WeightedRandomType is the registered type of the weighted random picker.
const WeightedRandomType = "weighted-random-picker"

// WeightedRandom picks endpoints with probability proportional to their
// score, without replacement, using Efraimidis–Spirakis A-Res keys
// U^(1/score): the n largest keys are a weighted sample. It spreads load
// where max-score would herd every request onto the momentary best.
// Endpoints scoring 0 are chosen only when nothing else is left.
type WeightedRandom struct{ base }

// NewWeightedRandom is the plugin factory.
func NewWeightedRandom(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	b, err := newBase(WeightedRandomType, name, raw, h)
	if err != nil {
		return nil, err
	}
	return &WeightedRandom{b}, nil
}

// Pick implements scheduling.Picker. The scored slice's Score fields are
// replaced by the sampling keys.
func (w *WeightedRandom) Pick(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, scored []scheduling.ScoredEndpoint) *scheduling.ProfileResult {
	if len(scored) == 0 {
		return nil
	}
	for i := range scored {
		u := w.rand.Float64()
		if s := scored[i].Score; s > 0 {
			scored[i].Score = math.Pow(u, 1/s)
		} else {
			// Below every positive-score key (those are in (0, 1]), still
			// random among themselves.
			scored[i].Score = u - 1
		}
	}
	slices.SortFunc(scored, func(a, b scheduling.ScoredEndpoint) int {
		switch {
		case a.Score > b.Score:
			return -1
		case a.Score < b.Score:
			return 1
		}
		return 0
	})
	return targets(cs, scored, w.n)
}
