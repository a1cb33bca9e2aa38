package picker

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

// RandomType is the registered type of the random picker.
const RandomType = "random-picker"

// Random ignores scores and picks uniformly: the baseline every smarter
// policy is measured against.
type Random struct{ base }

// NewRandom is the plugin factory.
func NewRandom(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	b, err := newBase(RandomType, name, raw, h)
	if err != nil {
		return nil, err
	}
	return &Random{b}, nil
}

// Pick implements scheduling.Picker.
func (p *Random) Pick(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, scored []scheduling.ScoredEndpoint) *scheduling.ProfileResult {
	if len(scored) == 0 {
		return nil
	}
	// A partial Fisher–Yates shuffle draws n distinct endpoints.
	n := min(p.n, len(scored))
	for i := range n {
		j := i + p.rand.IntN(len(scored)-i)
		scored[i], scored[j] = scored[j], scored[i]
	}
	return targets(cs, scored, n)
}
