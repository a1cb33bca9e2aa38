package picker

import (
	"context"
	"encoding/json"
	"sync/atomic"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

// RoundRobinType is the registered type of the round-robin picker.
const RoundRobinType = "round-robin-picker"

// RoundRobin ignores scores and cycles through the candidates in the order
// the scheduler passes them (the datastore's, sorted by name): the
// classic load balancer's policy, a baseline that spreads requests evenly
// by count but knows nothing of their size or of caches.
type RoundRobin struct {
	base
	next atomic.Uint64
}

// NewRoundRobin is the plugin factory.
func NewRoundRobin(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	b, err := newBase(RoundRobinType, name, raw, h)
	if err != nil {
		return nil, err
	}
	return &RoundRobin{base: b}, nil
}

// Pick implements scheduling.Picker: the primary is the next candidate in
// turn and the fallbacks are the ones after it.
func (p *RoundRobin) Pick(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, scored []scheduling.ScoredEndpoint) *scheduling.ProfileResult {
	if len(scored) == 0 {
		return nil
	}
	// The counter is shared by concurrent requests; when the candidate set
	// changes size, the rotation continues from wherever the counter is.
	start := int((p.next.Add(1) - 1) % uint64(len(scored)))
	n := min(p.n, len(scored))
	rotated := make([]scheduling.ScoredEndpoint, n)
	for i := range n {
		rotated[i] = scored[(start+i)%len(scored)]
	}
	return targets(cs, rotated, n)
}
