package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/kvhash"
)

// FinishAbort marks a stream whose request was aborted.
const FinishAbort = "abort"

// Runner drives an Engine in real time, optionally sped up, for the HTTP
// simulator: its Run goroutine steps the engine and sleeps out each step's
// modelled duration before handing the step's tokens to the request
// streams.
//
// Ownership: the engine and the stream table belong to the Runner and are
// guarded by its mutex; Submit, Abort, Release, Metrics and
// ResetPrefixCache may be called from any goroutine. The EventSink is
// called with that mutex held, so it must not block or call back into the
// Runner. It receives a step's events when the step's duration has elapsed,
// as vLLM publishes them after the forward pass.
type Runner struct {
	clock scaledClock
	kick  chan struct{} // new work for an idle Run; capacity 1
	sink  EventSink

	mu      sync.Mutex
	eng     *Engine
	streams map[string]*Stream // one per live request with a reader; bounded like the engine's requests
	// unsent is the step whose events wait for its duration to elapse;
	// ResetPrefixCache announces them before its own, as vLLM, which
	// resets between steps, would have.
	unsent *StepResult
}

// NewRunner builds an engine whose clock runs scale times faster than wall
// time (1 = real time); cfg.Clock is replaced by that clock.
func NewRunner(cfg Config, scale float64) (*Runner, error) {
	if !(scale > 0) {
		return nil, fmt.Errorf("%w: time scale %v must be positive", ErrConfig, scale)
	}
	clock := scaledClock{start: time.Now(), scale: scale}
	sink := cfg.Events
	cfg.Clock, cfg.Events = clock, nil
	eng, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Runner{clock: clock, kick: make(chan struct{}, 1), sink: sink, eng: eng, streams: make(map[string]*Stream)}, nil
}

// Now is the engine's (scaled) time.
func (r *Runner) Now() time.Time { return r.clock.Now() }

// Config returns the engine's configuration with defaults filled in.
func (r *Runner) Config() Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.Config()
}

// Submit queues a request and returns the stream its tokens will arrive
// on; errors are Engine.Add's.
func (r *Runner) Submit(req Request) (*Stream, error) {
	st := &Stream{id: req.ID, notify: make(chan struct{}, 1)}
	r.mu.Lock()
	err := r.eng.Add(req)
	if err == nil {
		r.streams[req.ID] = st
	}
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return st, nil
}

// Abort drops a request (its client went away); its stream finishes with
// FinishAbort.
func (r *Runner) Abort(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.eng.Abort(id); err != nil {
		return err
	}
	if st, ok := r.streams[id]; ok {
		delete(r.streams, id)
		st.finish(&Finished{ID: id, Reason: FinishAbort})
	}
	return nil
}

// Release frees a prefill-only request's held blocks.
func (r *Runner) Release(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.Release(id)
}

// CachedTokens is how many leading tokens of a request's prompt the prefix
// cache holds now, in full blocks and short of the last token (which is
// always computed): vLLM's local hit, before any connector's.
func (r *Runner) CachedTokens(prompt []int, extra kvhash.Extra) int {
	bs := r.eng.cfg.BlockSize
	n := (len(prompt) - 1) / bs
	if n <= 0 {
		return 0
	}
	hashes := r.eng.hasher.BlockHashes(prompt[:n*bs], extra)
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.eng.pool.longestHit(nil, hashes)) * bs
}

// Metrics snapshots the engine.
func (r *Runner) Metrics() Metrics {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.Metrics()
}

// ResetPrefixCache is Engine.ResetPrefixCache.
func (r *Runner) ResetPrefixCache() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.eng.ResetPrefixCache(); err != nil {
		return err
	}
	if r.sink != nil {
		r.publishUnsent()
		r.sink.Publish([]Event{&AllBlocksCleared{}})
	}
	return nil
}

// publishUnsent hands the pending step's events to the sink; r.mu is held.
func (r *Runner) publishUnsent() {
	if r.unsent != nil && len(r.unsent.Events) > 0 && r.sink != nil {
		r.sink.Publish(r.unsent.Events)
	}
	r.unsent = nil
}

// Run steps the engine until ctx is done and then returns nil. Requests
// still in flight stay in the engine; their streams see no more tokens.
func (r *Runner) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		res := r.eng.Step()
		r.unsent = res
		dur := res.Duration
		wake, hasWake := r.eng.NextWake()
		r.mu.Unlock()

		var wakeC <-chan time.Time
		switch {
		case dur > 0:
			timer.Reset(r.clock.wall(dur))
			wakeC = timer.C
		case hasWake:
			timer.Reset(r.clock.wall(wake.Sub(r.clock.Now())))
			wakeC = timer.C
		}
		if dur > 0 {
			// Only a finished step's tokens exist; new requests wait for it.
			select {
			case <-ctx.Done():
				return nil
			case <-wakeC:
			}
			r.deliver(res)
			continue
		}
		r.deliver(res) // an idle step can still have stored blocks: remote KV that landed
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		case <-wakeC:
		}
	}
}

// deliver hands a step's outputs to their streams. res is the engine's
// reusable result; Step is not called again until this returns.
func (r *Runner) deliver(res *StepResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unsent == res {
		r.publishUnsent()
	}
	for _, t := range res.Tokens {
		if st, ok := r.streams[t.ID]; ok {
			st.push(t.Token)
		}
	}
	for i := range res.Finished {
		f := res.Finished[i]
		if st, ok := r.streams[f.ID]; ok {
			delete(r.streams, f.ID)
			st.finish(&f)
		}
	}
}

// Stream carries one request's tokens from Run to its reader. Tokens
// accumulate until read, at most the request's MaxTokens of them.
type Stream struct {
	id     string
	notify chan struct{} // capacity 1: something new to read

	mu     sync.Mutex
	tokens []int
	fin    *Finished
}

// ID is the request's id.
func (s *Stream) ID() string { return s.id }

func (s *Stream) push(tok int) {
	s.mu.Lock()
	s.tokens = append(s.tokens, tok)
	s.mu.Unlock()
	s.signal()
}

func (s *Stream) finish(f *Finished) {
	s.mu.Lock()
	if s.fin == nil {
		s.fin = f
	}
	s.mu.Unlock()
	s.signal()
}

func (s *Stream) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Next waits for tokens not yet read, or for the end. It returns the new
// tokens (possibly none) and, once the request has finished, its Finished
// record; after that every call returns no tokens and the same record. The
// error is ctx's.
func (s *Stream) Next(ctx context.Context) ([]int, *Finished, error) {
	for {
		s.mu.Lock()
		toks, fin := s.tokens, s.fin
		s.tokens = nil
		s.mu.Unlock()
		if len(toks) > 0 || fin != nil {
			return toks, fin, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-s.notify:
		}
	}
}
