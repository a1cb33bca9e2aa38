package picker

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

// MaxScoreType is the registered type of the max-score picker.
const MaxScoreType = "max-score-picker"

// MaxScore picks the highest-scoring candidates. Ties are broken at random so
// that equal endpoints share load instead of the first one taking it all.
type MaxScore struct{ base }

// NewMaxScore is the plugin factory.
func NewMaxScore(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	b, err := newBase(MaxScoreType, name, raw, h)
	if err != nil {
		return nil, err
	}
	return &MaxScore{b}, nil
}

// Pick implements scheduling.Picker.
func (m *MaxScore) Pick(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, scored []scheduling.ScoredEndpoint) *scheduling.ProfileResult {
	if len(scored) == 0 {
		return nil
	}
	if m.n == 1 {
		// The common case needs no sort: one pass with reservoir sampling
		// among the endpoints tied for the best score.
		best, ties := 0, 1
		for i := 1; i < len(scored); i++ {
			switch s := scored[i].Score; {
			case s > scored[best].Score:
				best, ties = i, 1
			case s == scored[best].Score:
				ties++
				if m.rand.IntN(ties) == 0 {
					best = i
				}
			}
		}
		return targets(cs, scored[best:best+1], 1)
	}
	shuffle(scored, m.rand)
	slices.SortStableFunc(scored, func(a, b scheduling.ScoredEndpoint) int {
		switch {
		case a.Score > b.Score:
			return -1
		case a.Score < b.Score:
			return 1
		}
		return 0
	})
	return targets(cs, scored, m.n)
}

func shuffle(s []scheduling.ScoredEndpoint, r scheduling.Rand) {
	for i := len(s) - 1; i > 0; i-- {
		j := r.IntN(i + 1)
		s[i], s[j] = s[j], s[i]
	}
}
