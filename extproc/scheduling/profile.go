package scheduling

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// Errors a scheduling cycle can end with; callers map them to HTTP statuses.
var (
	// ErrNoCandidates: the pool (after the proxy's subset hint) is empty.
	ErrNoCandidates = errors.New("no candidate endpoints")
	// ErrAllFiltered: the filters removed every candidate.
	ErrAllFiltered = errors.New("filters removed all candidate endpoints")
)

// Extension points, as labelled in plugin duration metrics.
const (
	PointProfileHandler = "ProfileHandler"
	PointFilter         = "Filter"
	PointScorer         = "Scorer"
	PointPicker         = "Picker"
	PointPreRequest     = "PreRequest"
	PointResponse       = "ResponseComplete"
)

// Observer receives the duration of each plugin call; nil disables timing.
type Observer func(extensionPoint string, plugin TypedName, d time.Duration)

// WeightedScorer is a scorer with its weight in a profile.
type WeightedScorer struct {
	Scorer
	Weight float64
}

// Profile is one Filter → Score → Pick pipeline.
type Profile struct {
	Name    string
	Filters []Filter
	Scorers []WeightedScorer
	Picker  Picker
}

// scratch holds the per-cycle buffers a profile run needs.
type scratch struct {
	candidates []*endpoints.Endpoint
	one        []float64
	scored     []ScoredEndpoint
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Resized returns s with length n and every element zero, reusing its
// backing array when it is large enough: per-decision scratch of plugins
// and the framework, kept across requests without an allocation each.
func Resized[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// Grown is Resized without zeroing: for scratch whose every element the
// caller overwrites, where clearing would only add a pass over it.
func Grown[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Run executes the profile over candidates, which it does not modify.
func (p *Profile) Run(ctx context.Context, cs *CycleState, req *Request, candidates []*endpoints.Endpoint, observe Observer) (*ProfileResult, error) {
	if len(candidates) == 0 {
		return nil, ErrNoCandidates
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)

	sc.candidates = append(sc.candidates[:0], candidates...)
	eps := sc.candidates
	for _, f := range p.Filters {
		start := now(observe)
		eps = f.Filter(ctx, cs, req, eps)
		record(observe, PointFilter, f, start)
		if len(eps) == 0 {
			return nil, ErrAllFiltered
		}
	}

	// The weighted scores add up in the scored list itself.
	// Sized once and written in place: an append per candidate checks
	// the capacity each time.
	sc.scored = Grown(sc.scored, len(eps))
	for i, e := range eps {
		sc.scored[i] = ScoredEndpoint{Endpoint: e}
	}
	for _, ws := range p.Scorers {
		sc.one = Resized(sc.one, len(eps))
		start := now(observe)
		ws.Score(ctx, cs, req, eps, sc.one)
		record(observe, PointScorer, ws.Scorer, start)
		scored := sc.scored[:len(sc.one)]
		for i, s := range sc.one {
			scored[i].Score += ws.Weight * clamp01(s)
		}
	}
	start := now(observe)
	res := p.Picker.Pick(ctx, cs, req, sc.scored)
	record(observe, PointPicker, p.Picker, start)
	// The candidate buffer goes back to the pool: drop endpoint pointers so
	// that removed endpoints can be collected.
	clear(sc.candidates)
	clear(sc.scored)
	if res == nil || len(res.Targets) == 0 {
		return nil, ErrAllFiltered
	}
	return res, nil
}

// clamp01 keeps a misbehaving scorer from dominating: scores outside [0, 1]
// (or NaN) are pinned to the range.
func clamp01(s float64) float64 {
	switch {
	case s > 1:
		return 1
	case s >= 0:
		return s
	default: // negative or NaN
		return 0
	}
}

func now(observe Observer) time.Time {
	if observe == nil {
		return time.Time{}
	}
	return time.Now()
}

func record(observe Observer, point string, p Plugin, start time.Time) {
	if observe != nil {
		observe(point, p.TypedName(), time.Since(start))
	}
}
