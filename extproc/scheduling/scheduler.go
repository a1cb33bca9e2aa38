package scheduling

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// Scheduler runs the configured profiles for each request. It is immutable
// after construction and safe for concurrent use; plugins own their state.
type Scheduler struct {
	handler   ProfileHandler
	profiles  map[string]*Profile
	observe   Observer
	producers []DataProducer
	admitters []Admitter
	screeners []Screener
}

// Stages are the per-request steps that run before the profiles.
type Stages struct {
	// Producers run first, in this order (see OrderProducers).
	Producers []DataProducer
	Admitters []Admitter
	// Screeners run before all of them.
	Screeners []Screener
}

// maxProfileRounds bounds the handler loop so that a handler that never
// stops returning profiles cannot hang a request.
const maxProfileRounds = 8

// NewScheduler builds a scheduler; observe may be nil.
func NewScheduler(handler ProfileHandler, profiles map[string]*Profile, observe Observer, stages Stages) *Scheduler {
	return &Scheduler{handler: handler, profiles: profiles, observe: observe, producers: stages.Producers, admitters: stages.Admitters, screeners: stages.Screeners}
}

// Profiles returns the configured profiles by name. Callers must not modify it.
func (s *Scheduler) Profiles() map[string]*Profile { return s.profiles }

// Schedule picks endpoints for req among candidates.
func (s *Scheduler) Schedule(ctx context.Context, cs *CycleState, req *Request, candidates []*endpoints.Endpoint) (*Result, error) {
	if len(candidates) == 0 {
		return nil, ErrNoCandidates
	}
	if len(s.screeners) > 0 {
		if candidates = s.screen(ctx, cs, req, candidates); len(candidates) == 0 {
			return nil, ErrScreenedOut
		}
	}
	for _, p := range s.producers {
		start := now(s.observe)
		p.Produce(ctx, cs, req, candidates)
		record(s.observe, PointDataProducer, p, start)
	}
	for _, a := range s.admitters {
		start := now(s.observe)
		err := a.Admit(ctx, cs, req, candidates)
		record(s.observe, PointAdmitter, a, start)
		if err != nil {
			return nil, fmt.Errorf("%w by %s: %w", ErrNotAdmitted, a.TypedName(), err)
		}
	}
	results := cs.profileResults(len(s.profiles))
	var firstErr error
	for round := 0; ; round++ {
		if round == maxProfileRounds {
			return nil, fmt.Errorf("profile handler %s did not finish after %d rounds", s.handler.TypedName(), maxProfileRounds)
		}
		start := now(s.observe)
		next := s.handler.Pick(ctx, cs, req, s.profiles, results)
		record(s.observe, PointProfileHandler, s.handler, start)
		if len(next) == 0 {
			break
		}
		for _, p := range next {
			if _, done := results[p.Name]; done {
				return nil, fmt.Errorf("profile handler %s chose profile %q twice", s.handler.TypedName(), p.Name)
			}
			res, err := p.Run(ctx, cs, req, candidates, s.observe)
			if err != nil && firstErr == nil {
				firstErr = err
			}
			// A failed profile is recorded as nil so that the handler can
			// see it ran and decide (the P/D handler falls back to decode).
			results[p.Name] = res
		}
	}
	start := now(s.observe)
	res, err := s.handler.ProcessResults(ctx, cs, req, results)
	record(s.observe, PointProfileHandler, s.handler, start)
	if err != nil {
		return nil, err
	}
	if p := res.Primary(); p == nil || len(p.Targets) == 0 {
		if firstErr != nil {
			return nil, firstErr
		}
		return nil, ErrAllFiltered
	}
	return res, nil
}

// screen returns the candidates every screener keeps, in their order.
func (s *Scheduler) screen(ctx context.Context, cs *CycleState, req *Request, candidates []*endpoints.Endpoint) []*endpoints.Endpoint {
	kept := slices.Clone(candidates)
	allowed := make(map[*endpoints.Endpoint]bool, len(candidates))
	for _, sc := range s.screeners {
		start := now(s.observe)
		clear(allowed)
		for _, e := range sc.Screen(ctx, cs, req, candidates) {
			allowed[e] = true
		}
		record(s.observe, PointScreener, sc, start)
		kept = slices.DeleteFunc(kept, func(e *endpoints.Endpoint) bool { return !allowed[e] })
		if len(kept) == 0 {
			break
		}
	}
	return kept
}
