package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvgate/kvgate/internal/kvhash"
)

// Engine is one model server's scheduler and KV cache. It is not safe for
// concurrent use: one goroutine (or one event loop) owns it. Runner wraps
// it for real-time use.
type Engine struct {
	cfg    Config
	clock  Clock
	sink   EventSink
	hasher *kvhash.Hasher
	pool   *blockPool
	vocab  int

	byID map[string]*seq // every live request; bounded by MaxWaiting + MaxNumSeqs + held
	// waiting is in admission order: FCFS with preempted requests at the
	// front, or by (priority, arrival) under SchedulingPriority.
	waiting []*seq
	// running is in scheduling order; under FCFS the tail is preempted
	// first.
	running []*seq
	// arrivals numbers added requests (seq.arrival).
	arrivals uint64
	held     []*seq // by deadline
	// stepped is when Step last ran: a transfer that landed after it has not
	// been offered to admission yet.
	stepped time.Time

	stats counters

	// Scratch reused across steps so that a step allocates only for
	// outputs and events; events holds the last step's until the next.
	res    StepResult
	sched  []scheduled
	hitBuf []int32
	loras  map[string]struct{}
	events []Event
}

type scheduled struct {
	s *seq
	n int
}

type counters struct {
	prefixQueries, prefixHits     int64
	promptTokens, generatedTokens int64
	preemptions                   int64
	steps                         int64
	// iterationTokens are the tokens each step computed.
	iterationTokens histogram
}

// New builds an engine; the error wraps ErrConfig.
func New(cfg Config) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	h, err := kvhash.New(cfg.HashSeed, cfg.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	vocab := cfg.Timing.Model.Vocab
	if vocab <= 0 {
		vocab = 32000
	}
	return &Engine{
		cfg: cfg, clock: cfg.Clock, sink: cfg.Events, hasher: h,
		pool:  newBlockPool(cfg.NumGPUBlocks),
		vocab: vocab,
		byID:  make(map[string]*seq),
		loras: make(map[string]struct{}),
	}, nil
}

// Config returns the configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Add queues a request. It fails with ErrQueueFull when MaxWaiting requests
// already wait, and with ErrInvalidRequest, ErrTooLong, ErrDuplicateID or
// ErrLoRADisabled when the request cannot run.
func (e *Engine) Add(r Request) error {
	switch {
	case r.ID == "":
		return fmt.Errorf("%w: empty id", ErrInvalidRequest)
	case len(r.Prompt) == 0:
		return fmt.Errorf("%w: empty prompt", ErrInvalidRequest)
	case r.PrefillOnly && r.RemotePrefill != nil:
		return fmt.Errorf("%w: a request cannot be both prefill-only and remote-prefill", ErrInvalidRequest)
	case r.RemotePrefill != nil && r.RemotePrefill.Tokens < 0:
		return fmt.Errorf("%w: negative remote prefill tokens", ErrInvalidRequest)
	case r.LoRA != "" && e.cfg.MaxLoRAs == 0:
		return fmt.Errorf("%w: adapter %q", ErrLoRADisabled, r.LoRA)
	}
	if r.PrefillOnly {
		r.MaxTokens = 1
	}
	if r.MaxTokens < 1 {
		return fmt.Errorf("%w: max tokens %d", ErrInvalidRequest, r.MaxTokens)
	}
	if len(r.Prompt)+r.MaxTokens > e.cfg.MaxModelLen {
		return fmt.Errorf("%w: %d prompt + %d output tokens > %d", ErrTooLong,
			len(r.Prompt), r.MaxTokens, e.cfg.MaxModelLen)
	}
	if _, ok := e.byID[r.ID]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicateID, r.ID)
	}
	if len(e.waiting) >= e.cfg.MaxWaiting {
		return fmt.Errorf("%w: %d waiting", ErrQueueFull, len(e.waiting))
	}
	tokens := make([]int, len(r.Prompt), len(r.Prompt)+r.MaxTokens)
	copy(tokens, r.Prompt)
	r.Prompt = tokens[:len(r.Prompt):len(r.Prompt)]
	s := &seq{
		req: r, extra: kvhash.Extra{LoRA: r.LoRA, CacheSalt: r.CacheSalt, MM: r.MM},
		tokens: tokens, numPrompt: len(tokens), numCached: -1, rng: seedOf(r.ID),
		arrival: e.arrivals,
	}
	e.arrivals++
	e.byID[r.ID] = s
	if e.cfg.SchedulingPolicy == SchedulingPriority {
		e.insertByPriority(s)
	} else {
		e.waiting = append(e.waiting, s)
	}
	e.stats.promptTokens += int64(len(tokens))
	return nil
}

// Abort drops a request wherever it is (a client went away) and frees its
// blocks; a held prefill-only request is released.
func (e *Engine) Abort(id string) error {
	s, ok := e.byID[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownRequest, id)
	}
	switch s.state {
	case stateRunning:
		e.running = slices.DeleteFunc(e.running, func(x *seq) bool { return x == s })
	case stateHeld:
		e.held = slices.DeleteFunc(e.held, func(x *seq) bool { return x == s })
	default:
		e.waiting = slices.DeleteFunc(e.waiting, func(x *seq) bool { return x == s })
	}
	e.drop(s)
	return nil
}

// Release frees the blocks a prefill-only request holds, once its decoder
// has pulled them.
func (e *Engine) Release(id string) error {
	if s, ok := e.byID[id]; !ok || s.state != stateHeld {
		return fmt.Errorf("%w: no held blocks for %q", ErrUnknownRequest, id)
	}
	return e.Abort(id)
}

// drop forgets a request and frees its blocks.
func (e *Engine) drop(s *seq) {
	e.freeBlocks(s)
	delete(e.byID, s.req.ID)
}

// freeBlocks returns a request's blocks last-first, as vLLM does, so that a
// prompt's tail is evicted before its head, which other requests are more
// likely to share.
func (e *Engine) freeBlocks(s *seq) {
	slices.Reverse(s.blocks)
	e.pool.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.cachedBlocks = 0
}

// NextWake is the earliest future time at which something will change
// without a new request: a P/D transfer landing or held blocks expiring. An
// idle caller should Step again then. ok is false when nothing is pending.
// A transfer that has landed but waits behind a blocked queue is not a wake
// reason: whatever blocks the queue has its own.
func (e *Engine) NextWake() (t time.Time, ok bool) {
	now := e.clock.Now()
	for _, s := range e.waiting {
		if s.state != stateRemote || !s.ready.After(e.stepped) {
			continue
		}
		// One that landed since the last Step (between it and this call)
		// is due now: only a Step can take it in.
		at := s.ready
		if at.Before(now) {
			at = now
		}
		if !ok || at.Before(t) {
			t, ok = at, true
		}
	}
	if len(e.held) > 0 && (!ok || e.held[0].deadline.Before(t)) {
		t, ok = e.held[0].deadline, true
	}
	return t, ok
}

// Step runs one engine iteration: it schedules running requests first
// (decode and unfinished prefill chunks, preempting the policy's victim
// when blocks run out), then, if nothing was preempted, admits waiting requests
// into the remaining token budget. It returns the step's modelled duration
// and its outputs, which the caller should consider produced when its clock
// has advanced by Duration.
func (e *Engine) Step() *StepResult {
	now := e.clock.Now()
	e.stepped = now
	res := &e.res
	res.Duration, res.Shape = 0, Shape{}
	res.Tokens, res.Finished, res.Preempted = res.Tokens[:0], res.Finished[:0], res.Preempted[:0]
	res.Scheduled = res.Scheduled[:0]
	clear(e.events)
	e.events = e.events[:0]
	e.sched = e.sched[:0]
	clear(e.loras)
	e.expireHeld(now)

	budget := e.cfg.MaxNumBatchedTokens
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := min(len(s.tokens)-s.computed, budget)
		ok := e.allocate(s, n, nil)
		for !ok {
			v := e.victim()
			victim := e.running[v]
			e.running = slices.Delete(e.running, v, v+1)
			if v < i {
				// Already scheduled in this step: its tokens go back to
				// the budget, as vLLM undoes them.
				i--
				budget += e.unschedule(victim)
			}
			e.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
			ok = e.allocate(s, n, nil)
		}
		if !ok {
			// s itself was the victim. The rest of the batch outranks it
			// and goes on in this step (vLLM leaves it to the next one;
			// an empty step here would look idle).
			i--
			continue
		}
		e.cacheFull(s, min(s.computed+n, len(s.tokens)))
		e.sched = append(e.sched, scheduled{s, n})
		budget -= n
		if s.req.LoRA != "" {
			e.loras[s.req.LoRA] = struct{}{}
		}
	}
	// A step that preempted admits nothing, unless it scheduled nothing at
	// all: then admission is the only way forward.
	if !preempted || len(e.sched) == 0 {
		budget = e.admit(now, budget)
	}
	e.execute(now)
	res.Events = e.events
	if len(e.events) > 0 && e.sink != nil {
		e.sink.Publish(e.events)
	}
	if res.Duration > 0 {
		e.stats.steps++
		e.stats.iterationTokens.observe(res.Shape.PrefillTokens + res.Shape.DecodeSeqs)
	}
	return res
}

// victim is the index of the running request KV pressure preempts: the
// newest under FCFS, the one with the largest (priority, arrival) under
// SchedulingPriority, as vLLM chooses.
func (e *Engine) victim() int {
	if e.cfg.SchedulingPolicy != SchedulingPriority {
		return len(e.running) - 1
	}
	v := 0
	for i, s := range e.running[1:] {
		if !before(s, e.running[v]) {
			v = i + 1
		}
	}
	return v
}

// before orders requests under SchedulingPriority: lower priority value
// first, then earlier arrival.
func before(a, b *seq) bool {
	if a.req.Priority != b.req.Priority {
		return a.req.Priority < b.req.Priority
	}
	return a.arrival < b.arrival
}

// insertByPriority puts s into the waiting queue at its (priority,
// arrival) place; vLLM's priority queue has no front for preempted
// requests to return to.
func (e *Engine) insertByPriority(s *seq) {
	k, _ := slices.BinarySearchFunc(e.waiting, s, func(x, t *seq) int {
		if before(x, t) {
			return -1
		}
		return 1
	})
	e.waiting = slices.Insert(e.waiting, k, s)
}

// unschedule takes s out of the step being built and returns its tokens.
func (e *Engine) unschedule(s *seq) int {
	for k, sc := range e.sched {
		if sc.s == s {
			e.sched = slices.Delete(e.sched, k, k+1)
			return sc.n
		}
	}
	return 0
}

// admit schedules waiting requests in order while the batch has room. A
// request whose adapter cannot join the batch, or whose remote KV has not
// arrived, is skipped and keeps its place; one that does not fit in the
// free blocks stops admission, as in vLLM.
func (e *Engine) admit(now time.Time, budget int) int {
	bs := e.cfg.BlockSize
	kept := e.waiting[:0]
	stop := false
	for _, s := range e.waiting {
		if stop || budget <= 0 || len(e.running) >= e.cfg.MaxNumSeqs {
			stop = true
			kept = append(kept, s)
			continue
		}
		if s.state == stateRemote {
			if now.Before(s.ready) {
				kept = append(kept, s)
				continue
			}
			s.state = stateWaiting
			s.computed = s.remotePending
			e.cacheFull(s, s.computed)
		}
		if lora := s.req.LoRA; lora != "" && len(e.loras) >= e.cfg.MaxLoRAs {
			if _, ok := e.loras[lora]; !ok {
				kept = append(kept, s)
				continue
			}
		}
		var hit []int32
		if s.computed == 0 {
			maxHit := (len(s.tokens) - 1) / bs
			e.ensureHashes(s, maxHit*bs)
			hit = e.pool.longestHit(e.hitBuf[:0], s.hashes[:maxHit])
			e.hitBuf = hit
		}
		hitTokens := len(hit) * bs
		if rp := s.req.RemotePrefill; rp != nil && !s.remoteDone {
			if ext := min(rp.Tokens, len(s.tokens)-1) - hitTokens; ext > 0 {
				if !e.allocateWaiting(s, ext, hit) {
					stop = true
					kept = append(kept, s)
					continue
				}
				// The pulled blocks enter the prefix cache only when they
				// land, so that no other request hits them before then.
				s.remoteDone = true
				e.firstSchedule(now, s, hitTokens, hitTokens+ext)
				s.remotePending = s.computed + ext
				s.state = stateRemote
				s.ready = now.Add(e.transferTime(rp, ext))
				kept = append(kept, s)
				continue
			}
			s.remoteDone = true
		}
		n := min(len(s.tokens)-s.computed-hitTokens, budget)
		if !e.allocateWaiting(s, n, hit) {
			stop = true
			kept = append(kept, s)
			continue
		}
		e.cacheFull(s, min(s.computed+n, len(s.tokens)))
		e.firstSchedule(now, s, hitTokens, hitTokens)
		s.state = stateRunning
		e.running = append(e.running, s)
		e.sched = append(e.sched, scheduled{s, n})
		budget -= n
		if s.req.LoRA != "" {
			e.loras[s.req.LoRA] = struct{}{}
		}
	}
	clear(e.waiting[len(kept):])
	e.waiting = kept
	return budget
}

// allocateWaiting is allocate for a waiting request. With nothing running,
// no finishing request will ever free blocks, so blocks held by other
// waiting requests (pulled remote KV, or a request its adapter keeps out of
// the batch) are reclaimed, newest first, rather than letting the engine
// stall: those requests will recompute, like preempted ones.
func (e *Engine) allocateWaiting(s *seq, n int, hit []int32) bool {
	for !e.allocate(s, n, hit) {
		if len(e.running) > 0 || !e.reclaimWaiting(s) {
			return false
		}
	}
	return true
}

func (e *Engine) reclaimWaiting(keep *seq) bool {
	for i := len(e.waiting) - 1; i >= 0; i-- {
		x := e.waiting[i]
		if x == keep || len(x.blocks) == 0 {
			continue
		}
		e.freeBlocks(x)
		x.computed, x.remotePending = 0, 0
		x.state = stateWaiting
		x.preemptions++
		e.stats.preemptions++
		e.res.Preempted = append(e.res.Preempted, x.req.ID)
		return true
	}
	return false
}

// firstSchedule records prefix-cache statistics once per request, as vLLM
// does for requests that were never preempted, and when the request left
// the queue.
func (e *Engine) firstSchedule(now time.Time, s *seq, localHit, cached int) {
	if s.numCached >= 0 {
		return
	}
	s.scheduledAt = now
	s.numCached = cached
	e.stats.prefixQueries += int64(len(s.tokens))
	e.stats.prefixHits += int64(localHit)
}

func (e *Engine) transferTime(rp *RemotePrefill, tokens int) time.Duration {
	bytes := float64(tokens) * float64(e.cfg.Timing.Model.KVBytesPerToken())
	bw, lat := e.cfg.KVTransferBandwidth, e.cfg.KVTransferLatency
	if rp.Bandwidth > 0 {
		bw, lat = rp.Bandwidth, rp.Latency
	}
	return lat + time.Duration(bytes/bw*float64(time.Second))
}

// allocate gives s the blocks to hold its prefix hit plus n more tokens,
// taking hit references first. It changes nothing and returns false when
// the free queue is too short. The caller caches the blocks that the step
// fills (cacheFull).
func (e *Engine) allocate(s *seq, n int, hit []int32) bool {
	bs := e.cfg.BlockSize
	computed := s.computed + len(hit)*bs
	need := max(0, (computed+n+bs-1)/bs-len(s.blocks)-len(hit))
	if need+e.pool.evictableAmong(hit) > e.pool.numFree {
		return false
	}
	e.pool.touch(hit)
	s.blocks = append(s.blocks, hit...)
	s.cachedBlocks += len(hit)
	s.computed = computed
	s.blocks = e.pool.alloc(s.blocks, need, e.evicted)
	return true
}

func (e *Engine) evicted(h kvhash.Hash) {
	e.events = append(e.events, &BlockRemoved{BlockHashes: []uint64{h.Uint64()}, Medium: MediumGPU})
}

// ensureHashes extends s's hash chain over its first n tokens.
func (e *Engine) ensureHashes(s *seq, n int) {
	if len(s.hashes) < n/e.cfg.BlockSize {
		s.hashes = e.hasher.AppendBlockHashes(s.hashes, s.tokens[:n], s.extra)
	}
}

// cacheFull registers s's blocks that are full within its first n tokens
// and announces them in one BlockStored event.
func (e *Engine) cacheFull(s *seq, n int) {
	bs := e.cfg.BlockSize
	full := min(n/bs, len(s.blocks))
	if full <= s.cachedBlocks {
		return
	}
	e.ensureHashes(s, full*bs)
	first := s.cachedBlocks
	ev := &BlockStored{
		BlockHashes: make([]uint64, 0, full-first),
		TokenIDs:    s.tokens[first*bs : full*bs : full*bs],
		BlockSize:   bs,
		LoRAName:    s.req.LoRA,
		Medium:      MediumGPU,
	}
	if first > 0 {
		ev.ParentBlockHash, ev.HasParent = s.hashes[first-1].Uint64(), true
	}
	for i := first; i < full; i++ {
		e.pool.cache(s.blocks[i], s.hashes[i])
		ev.BlockHashes = append(ev.BlockHashes, s.hashes[i].Uint64())
	}
	s.cachedBlocks = full
	e.events = append(e.events, ev)
}

// preempt frees a running request's blocks and puts it back at the front
// of the waiting queue; it will recompute its prompt and output so far,
// likely from its own still-cached blocks.
func (e *Engine) preempt(s *seq) {
	e.freeBlocks(s)
	s.computed = 0
	s.state = stateWaiting
	s.preemptions++
	e.stats.preemptions++
	if e.cfg.SchedulingPolicy == SchedulingPriority {
		e.insertByPriority(s)
	} else {
		e.waiting = slices.Insert(e.waiting, 0, s)
	}
	e.res.Preempted = append(e.res.Preempted, s.req.ID)
}

// execute advances every scheduled request by its tokens, samples where a
// request has computed all it has, finishes requests and prices the step.
func (e *Engine) execute(now time.Time) {
	res := &e.res
	sh := &res.Shape
	finished := false
	for _, sc := range e.sched {
		s, n := sc.s, sc.n
		ctx := s.computed
		q := ScheduledSeq{ID: s.req.ID, Tokens: n, Context: ctx,
			Decode: s.out > 0 && n == 1 && ctx == len(s.tokens)-1, Sampled: ctx+n >= len(s.tokens)}
		q.Add(sh)
		res.Scheduled = append(res.Scheduled, q)
		s.computed += n
		if !q.Sampled {
			continue // a prefill chunk: vLLM discards its sample
		}
		tok := s.nextToken(e.vocab)
		s.tokens = append(s.tokens, tok)
		res.Tokens = append(res.Tokens, TokenOutput{ID: s.req.ID, Token: tok, Index: s.out})
		s.out++
		e.stats.generatedTokens++
		if s.out >= s.req.MaxTokens || len(s.tokens) >= e.cfg.MaxModelLen {
			finished = true
			e.finish(s)
		}
	}
	res.Duration = e.cfg.Timing.StepDuration(*sh)
	if finished {
		e.running = slices.DeleteFunc(e.running, func(s *seq) bool { return s.state != stateRunning })
	}
	// Held blocks time out relative to the end of the step that finished
	// the prefill.
	for i := len(e.held) - 1; i >= 0 && e.held[i].deadline.IsZero(); i-- {
		e.held[i].deadline = now.Add(res.Duration + e.cfg.HeldBlockTimeout)
	}
}

func (e *Engine) finish(s *seq) {
	f := Finished{
		ID: s.req.ID, Reason: FinishLength, Preemptions: s.preemptions, Scheduled: s.scheduledAt,
		Usage: Usage{PromptTokens: s.numPrompt, CompletionTokens: s.out, CachedTokens: max(s.numCached, 0)},
	}
	if s.req.PrefillOnly {
		ids := make([]int, len(s.blocks))
		for i, b := range s.blocks {
			ids[i] = int(b)
		}
		f.Transfer = &TransferParams{BlockIDs: ids}
		s.state = stateHeld
		s.deadline = time.Time{}
		e.held = append(e.held, s)
	} else {
		s.state = stateWaiting // anything but running: execute compacts on it
		e.drop(s)
	}
	e.res.Finished = append(e.res.Finished, f)
}

// expireHeld frees the blocks of prefill-only requests whose decoder never
// came for them.
func (e *Engine) expireHeld(now time.Time) {
	n := 0
	for n < len(e.held) && !now.Before(e.held[n].deadline) {
		e.drop(e.held[n])
		n++
	}
	if n > 0 {
		clear(e.held[:n])
		e.held = e.held[n:]
	}
}

// ResetPrefixCache forgets every cached block, as vLLM's
// /reset_prefix_cache does, and announces AllBlocksCleared. It fails with
// ErrCacheInUse while any request holds blocks.
func (e *Engine) ResetPrefixCache() error {
	if !e.pool.reset() {
		return fmt.Errorf("%w: %d blocks referenced", ErrCacheInUse, e.pool.used())
	}
	if e.sink != nil {
		e.sink.Publish([]Event{&AllBlocksCleared{}})
	}
	return nil
}
