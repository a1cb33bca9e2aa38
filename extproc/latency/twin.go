package latency

import (
	"math"
	"slices"
	"time"
)

// The engine twin. A continuously batching server runs steps: every step
// computes one token of each decoding sequence and then, FCFS, chunks of
// waiting prompts up to a token budget; a prompt's first token comes at
// the end of the step that computes its last chunk. TTFT is therefore a
// sum of step times, quantised by the budget: a 24-token prompt behind a
// 10,000-token one waits for the second step, and one arriving during a
// step waits it out. A backlog-level regression cannot show where a
// request lands in that sequence; a twin of the scheduler can.
//
// The picker knows every request it routed to an endpoint (its cached and
// uncached prompt tokens, when it was routed, whether its first token came)
// and sees the real step ends: each response chunk ends one (the step
// clock) and each first token ends the step that finished that prompt. The
// twin keeps the endpoint's prefill queue, runs the scheduler forward on
// its own clock with the fitted step cost, and locks its phase onto every
// real step end it sees. A prediction copies the queue, appends the new
// request and runs the schedule until its first token.
//
// A step's cost has a roofline's shape: a fixed host overhead and a cost
// per sequence sampled, plus the larger of its compute (tokens, causal
// attention pairs) and its memory traffic (the weights, the KV context
// read). Which of the two bounds a step follows from its shape and the
// current fit; given that, the step's cost is linear in the coefficients,
// and so is a TTFT, a sum of steps, over the summed shapes: the recursive
// least-squares fit learns them from observed TTFTs alone. The schedule
// itself (which step a chunk lands in) does not depend on the
// coefficients, only its timing does.
//
// What no decision-time model sees: which requests routed after the
// decision share its last step (a burst-mate's 8,000-token chunk makes a
// short prompt's step long; joiners.go prices how many to expect), and
// waits for KV blocks to free at saturation (not modelled yet). The twin
// is used only while the picker knows the whole queue: traffic it did not
// route (a scrape's excess) or a queue beyond maxTwinQueue fall back to
// the feature model.

// DefaultTokenBudget is vLLM's --max-num-batched-tokens.
const DefaultTokenBudget = 8192

// maxRunning is vLLM's --max-num-seqs: the running batch's bound.
const maxRunning = 256

// maxTwinQueue bounds an endpoint's tracked prefill queue.
const maxTwinQueue = 512

// maxTwinSteps bounds one simulation (a prediction or an advance): a
// backlog of 4096 full steps is half a minute of prefill or more.
const maxTwinSteps = 4096

// twinFeatures is the step cost's term count: overhead, tokens, attention
// pairs, sampled sequences (per 100), memory-bound steps, context tokens
// read by memory-bound steps.
const twinFeatures = 6

// maxTwinLag is the longest a step in progress may have run by the step
// clock before the clock counts as stale (an idle spell, not one step).
const maxTwinLag = int64(time.Second)

// twinHuber is the share of a first token's time beyond which the twin's
// fit learns from it as from an outlier (rls.updateRel). Some first tokens
// hold what the twin's schedule does not: a phase it had wrong, a held
// prompt's release, work it was not told of. Fitted at full weight, each
// such miss moved the coefficients, and one H200 of a mixed fleet ended a
// run pricing a 2,048-token prefill at 76 ms where it takes 57 (seed 3,
// ×2: TTFT MAPE 10.4 %; 8.0 % with the weight, benchmarks/RESULTS.md).
const twinHuber = 0.1

// twinPrior is a step of an 8B model on one modern GPU, weakly held: 2 ms
// overhead, 30 µs a token, 1 ns an attention pair, 10 µs a sampled
// sequence; a memory-bound step reads the weights in 6 ms and a context
// token in 50 ns.
var twinPrior = []float64{0.002, 0.030, 1, 0.001, 0.006, 0.05}

// Engine is an endpoint's live state beside its queue, read at the event.
type Engine struct {
	// Decodes and DecodeTokens are the sequences decoding there (past
	// their first token) and their context tokens.
	Decodes, DecodeTokens float64
	// StepEnd is the last step end the step clock saw (zero: none).
	StepEnd time.Time
	// External is the server's requests the picker did not route (a
	// scrape's excess): while there are any the twin's queue is
	// incomplete and the feature model predicts.
	External float64
	// Steps is the count of the server's step ends the step clock saw
	// (zero: none; modulo 2³²): the calendar's sequences age by it
	// (completions.go).
	Steps uint32
}

func (e Engine) stepEnd() int64 {
	if e.StepEnd.IsZero() {
		return 0
	}
	return e.StepEnd.UnixNano()
}

// twinEntry is one routed request still in prefill. done is the prompt
// tokens the twin believes computed.
type twinEntry struct {
	seq              uint64
	routed           int64 // unix ns
	cached, uncached int64
	done             int64
	// bound is the max_tokens it asked for (0: none).
	bound int64
	// held is a prompt the picker holds until no prompt it sent to the
	// server is in prefill (Config.HoldTokens); clear is set by the first
	// step that begins so, which it sits out: it was released at that
	// step's start and reached the server after the step had begun.
	held, clear bool
}

// waiting reports whether the entry is held in the picker still.
func (e *twinEntry) waiting() bool { return e.held && !e.clear && e.done == 0 }

// twin is one endpoint's queue and clock; its fit's twinMu guards it.
type twin struct {
	q []twinEntry
	// scratch is the projection's copy of q, reused across predictions.
	scratch []twinEntry
	// untracked counts requests routed here beyond maxTwinQueue that have
	// not finished their prefill: while any is, the queue is incomplete.
	untracked int
	// start is the unix ns at which the step in progress (by the twin's
	// clock) began; zero when the queue is empty.
	start int64
	// guessed is whether start is the twin's own estimate of a step end
	// (the fitted cost of the step before), not an instant it saw.
	guessed bool
	// idleEnd is the last real step end an advance saw while the queue
	// was empty, while the server decoded (zero: it did not): the step in
	// progress when the next request arrives began there, not at its
	// arrival, and the step clock has moved on by the time the twin
	// next advances.
	idleEnd int64
	// version counts the queue's changes, traj is the queue's schedule
	// as of a version (twincache.go); noCache turns it off (tests).
	version uint64
	traj    trajectory
	noCache bool
	// join is the recent arrival of prompts that can share a queued
	// prompt's last step (joiners.go).
	join joinRate
	// dec is the calendar of decoding sequences with a bound, clock the
	// projection's scratch over it (completions.go).
	dec   []decoding
	clock completionClock
}

// twinSample is what a twin prediction recorded for learning: the
// summed step shapes from start to the request's first token.
type twinSample struct {
	ok bool
	// at is the decision instant, start the twin step's start (unix ns).
	at, start int64
	// x is the summed shapes, first the first step's alone.
	x, first [maxFeatures]float64
	// last is the shape of the step that produces the first token.
	last stepShape
	// hindsight is x with the requests routed later that shared that
	// step (FirstTokenAt): what the step cost is learned from.
	hindsight [maxFeatures]float64
	// joiners is the seconds the prompts expected to arrive before that
	// step begins add to it (joiners.go), at weight 1.
	joiners float64
	// imposed is the seconds the request's first chunk adds to the first
	// tokens of the queue's prompts that finish in the same step.
	imposed float64
	// tracked is the uncached tokens of the queue's prompts: the prefill
	// backlog the twin knows of, against the live load's.
	tracked float64
}

// stepShape is what one step computes.
type stepShape struct {
	tokens, attn, seqs, ctx float64
	// finishing counts the prompts whose last chunk the step computes.
	finishing int
}

func (s stepShape) empty() bool { return s.tokens == 0 }

// x is the step's feature vector under theta: the compute terms or the
// memory terms, whichever costs more.
func (s stepShape) x(theta *[maxFeatures]float64) [maxFeatures]float64 {
	tok, attn, ctx := s.tokens/1e3, s.attn/1e9, s.ctx/1e6
	if theta[1]*tok+theta[2]*attn >= theta[4]+theta[5]*ctx {
		return [maxFeatures]float64{1, tok, attn, s.seqs / 100, 0, 0}
	}
	return [maxFeatures]float64{1, 0, 0, s.seqs / 100, 1, ctx}
}

// stepNanos is the step's cost under coefficients theta.
func stepNanos(theta *[maxFeatures]float64, s stepShape) int64 {
	x := s.x(theta)
	return nanos(dot(theta, &x))
}

// nanos is a step's cost of d seconds, at least 1 µs and bounded.
func nanos(d float64) int64 {
	if !(d < maxPrediction) { // also NaN
		d = maxPrediction
	}
	return max(int64(time.Microsecond), int64(d*1e9))
}

// schedule is the step starting at t over queue q, with decodes sequences
// of ctx context tokens decoding besides (the engine's): decodes first, then
// FCFS chunks of the entries routed by t within the budget, while fewer
// than maxRunning sequences run (freed of the decoding ones are expected
// to have finished by t: a projection's, see completions.go). With apply it
// advances the entries' progress, those from index capFrom on to at most
// one token short of their prompt: a step that really ended without their
// first token did not finish them. Entries whose prompt is computed (in a
// projection) decode like the others. The slot is what the step leaves for
// an entry appended after q.
func schedule(q []twinEntry, t int64, decodes, ctx, freed float64, budget int64, apply bool, capFrom int) (stepShape, slot) {
	for i := range q {
		if q[i].done >= q[i].uncached {
			decodes++
			ctx += float64(q[i].cached + q[i].uncached)
		}
	}
	s := stepShape{tokens: decodes, seqs: decodes, ctx: ctx, attn: ctx + decodes}
	room := budget - int64(decodes)
	// A place frees once a whole sequence is expected to have finished.
	running := int(math.Ceil(decodes - freed))
	open := true
	// busy is whether a prompt the server has is in prefill at the step's
	// start (ahead of a held entry or behind it: a held prompt goes only
	// when none is).
	busy := false
	for i := range q {
		if e := &q[i]; e.done < e.uncached && e.routed <= t && !e.waiting() {
			busy = true
			break
		}
	}
	for i := range q {
		e := &q[i]
		if room <= 0 || running >= maxRunning {
			open = false
			break
		}
		if e.done >= e.uncached {
			continue
		}
		if e.routed > t {
			open = false
			break // FCFS: later entries arrived later still
		}
		if e.waiting() {
			if busy {
				continue
			}
			// Released at this step's start (the last first token), it
			// reaches the server after the step began, and sits it out;
			// an idle server takes it on arrival. The held prompts behind
			// it wait for it.
			busy = true
			if apply {
				e.clear = true
			}
			if s.tokens > 0 {
				continue
			}
		}
		n := min(e.uncached-e.done, room)
		s.add(n, e.cached+e.done, e.done+n >= e.uncached)
		room -= n
		running++
		if apply {
			e.done += n
			if i >= capFrom {
				e.done = min(e.done, e.uncached-1)
			}
		}
	}
	return s, slot{room: room, open: open && room > 0 && running < maxRunning}
}

// slot is what a step leaves for one more entry: the budget left, and
// whether the scheduler would reach it (an entry routed by the step's
// start would be admitted).
type slot struct {
	room int64
	open bool
}

// add puts a chunk of n prompt tokens after past computed ones into the
// step; finishing when it is the prompt's last.
func (s *stepShape) add(n, past int64, finishing bool) {
	p := float64(past)
	s.tokens += float64(n)
	s.attn += float64(n)*p + float64(n)*float64(n+1)/2
	s.ctx += p + float64(n)
	if finishing {
		s.seqs++
		s.finishing++
	}
}

// imposedBy is what a request's first chunk costs the prompts that
// finish in the step it joins: alone is the step without the chunk, with
// the step with it; each of alone's finishing prompts gets its first token
// later by the difference. This is the one delay a decision can cause
// that the requests it delays could not have been told about at their own
// decision (a burst-mate routed a moment later filling the step that
// holds a short prompt's last chunk), so a scorer that counts it routes
// burst-mates apart when it costs them little, and the earlier requests'
// predictions hold.
func imposedBy(theta *[maxFeatures]float64, alone, with *stepShape) float64 {
	xa, xw := alone.x(theta), with.x(theta)
	return float64(alone.finishing) * (dot(theta, &xw) - dot(theta, &xa))
}

// nextArrival is the routing time of the first entry not yet admitted at
// t, or 0.
func nextArrival(q []twinEntry, t int64) int64 {
	for i := range q {
		if q[i].done < q[i].uncached && q[i].routed > t {
			return q[i].routed
		}
	}
	return 0
}

// advance runs the twin's clock to `to`: every step that ends by then is
// applied. A real step end seen after the twin's step began (the step
// clock's) locks the phase: the twin's step in progress ends there, unless
// (with rephase) that step began at an end the twin estimated and the real
// end is nearer to that estimate than to the step's own end: then the real
// end is the previous step's, a little later than its fitted cost said,
// and the step in progress begins there. Taking it for the end of the
// step in progress instead credited a decode step that ran 8.3 ms where
// the fit said 7.7 with the whole first chunk of the prompt queued behind
// it (a 7,000-token prompt believed computed when the server had not
// begun it).
func (w *twin) advance(to int64, eng Engine, budget int64, theta *[maxFeatures]float64, rephase bool) {
	real := eng.stepEnd()
	if len(w.q) == 0 {
		w.start, w.idleEnd = 0, 0
		if eng.Decodes > 0 {
			w.idleEnd = real
		}
		return
	}
	if w.start == 0 {
		// The queue was empty: the head's step began when it arrived,
		// unless the server was decoding (then the step in progress began
		// at the last step end before the arrival, and the head joins the
		// next one). That end is the one seen at the decision (the step
		// clock may have passed the arrival since): starting the head's
		// step at its arrival instead put its first chunk into a decode
		// step that had begun without it, so the twin believed a whole
		// step of its prompt computed that the server had not begun.
		h := w.q[0].routed
		w.start, w.guessed = h, false
		prev := w.idleEnd
		if eng.Decodes > 0 && real <= h {
			prev = max(prev, real)
		}
		if prev > 0 && prev <= h && h-prev < maxTwinLag {
			w.start = prev
		}
	}
	if real > w.start && real <= to {
		w.run(real, eng, budget, theta)
		if !rephase || !w.rephased(real, eng, budget, theta) {
			w.lock(real, eng, budget, 0)
		}
	}
	w.run(to, eng, budget, theta)
}

// rephased moves the start of the twin's step in progress to the real
// step end t when the start was estimated and t is nearer to it than to
// the step's fitted end (see advance).
func (w *twin) rephased(t int64, eng Engine, budget int64, theta *[maxFeatures]float64) bool {
	if !w.guessed || t <= w.start {
		return false
	}
	s, _ := schedule(w.q, w.start, eng.Decodes, eng.DecodeTokens, 0, budget, false, 0)
	if s.empty() || t-w.start >= w.start+stepNanos(theta, s)-t {
		return false
	}
	w.start, w.guessed = t, false
	return true
}

// run applies the steps that end by `to`. A step that would finish a
// prompt stays in progress until that prompt's first token is seen (the
// picker sees every first token: one not seen has not come).
func (w *twin) run(to int64, eng Engine, budget int64, theta *[maxFeatures]float64) {
	if tr := &w.traj; tr.of(w, eng, theta) && len(tr.steps) > 0 && !tr.steps[0].empty {
		// The step in progress is the trajectory's first: no need to
		// schedule the queue to see it has not ended.
		if s := &tr.steps[0].s; s.finishing > 0 || w.start+stepNanos(theta, *s) > to {
			return
		}
	}
	for range maxTwinSteps {
		s, _ := schedule(w.q, w.start, eng.Decodes, eng.DecodeTokens, 0, budget, false, 0)
		if s.empty() {
			next := nextArrival(w.q, w.start)
			if next == 0 || next > to {
				return
			}
			w.start, w.guessed = next, false
			continue
		}
		end := w.start + stepNanos(theta, s)
		if end > to || s.finishing > 0 {
			return
		}
		schedule(w.q, w.start, eng.Decodes, eng.DecodeTokens, 0, budget, true, 0)
		w.start, w.guessed = end, true
	}
}

// lock ends the twin's step in progress at the real step end t, which
// finished the prompts before index capFrom and no others.
func (w *twin) lock(t int64, eng Engine, budget int64, capFrom int) {
	if t <= w.start {
		return
	}
	schedule(w.q, w.start, eng.Decodes, eng.DecodeTokens, 0, budget, true, capFrom)
	w.start, w.guessed = t, false
}

// routed adds a request to the queue; false when the queue is full (the
// request counts as untracked until its prefill ends).
func (w *twin) routed(seq uint64, at int64, cached, uncached, hold, bound int64) bool {
	if len(w.q) >= maxTwinQueue {
		w.untracked++
		return false
	}
	uncached = max(1, uncached)
	w.q = append(w.q, twinEntry{seq: seq, routed: at, cached: cached, uncached: uncached, bound: bound, held: w.holds(uncached, hold)})
	w.version++
	if !holdable(uncached, hold) {
		w.join.add(at, cached, uncached)
	}
	return true
}

// firstToken takes a request's first token at `at` into the queue: the
// step that computed its last chunk ended then, and every request ahead of
// it (FCFS) is past its prefill too. With the request's projection s it
// adds to s.hindsight the requests routed after the decision that had
// arrived when that step began: they shared its leftover budget, which the
// projection could not know (a short prompt's step grows by a burst-mate's
// 8,000-token chunk). Requests routed later cannot change its earlier
// steps: FCFS, theirs come after.
func (w *twin) firstToken(seq uint64, at int64, s *twinSample, eng Engine, budget int64, theta *[maxFeatures]float64) {
	i := slices.IndexFunc(w.q, func(e twinEntry) bool { return e.seq == seq })
	if i < 0 {
		return
	}
	if s != nil && s.ok {
		last := s.last
		room := budget - int64(last.tokens)
		for _, e := range w.q[i+1:] {
			if room <= 0 || e.held || e.routed > at-stepNanos(theta, last) {
				continue
			}
			n := min(e.uncached, room)
			last.tokens += float64(n)
			last.attn += float64(n)*float64(e.cached) + float64(n)*float64(n+1)/2
			last.ctx += float64(e.cached + n)
			room -= n
			if n == e.uncached {
				last.seqs++
			}
		}
		a, b := s.last.x(theta), last.x(theta)
		for k := range s.hindsight {
			s.hindsight[k] = s.x[k] - a[k] + b[k]
		}
	}
	// The first token names the step that ended at `at`: no rephasing.
	w.advance(at, eng, budget, theta, false)
	w.lock(at, eng, budget, i+1)
	for k := range i {
		// A held prompt not begun was not ahead of it at the server: the
		// picker sent it later.
		if e := &w.q[k]; !e.held || e.done > 0 {
			e.done = e.uncached
		}
	}
	w.decodes(&w.q[i], eng.Steps)
	w.q = slices.Delete(w.q, i, i+1)
	w.version++
	if len(w.q) == 0 {
		// A step ended at the first token, and its request decodes now.
		w.start, w.idleEnd = 0, at
	}
}

// holds reports whether a prompt of uncached tokens routed now is held
// under a hold of minTokens hold: it is long, and a prompt is in prefill
// ahead of it (every queued entry is: one leaves at its first token).
func (w *twin) holds(uncached, hold int64) bool {
	return holdable(uncached, hold) && (len(w.q) > 0 || w.untracked > 0)
}

// holdable reports whether a prompt of uncached tokens is long enough for
// a hold of minTokens hold to hold it while a prompt is in prefill; such a
// prompt never joins another's last step.
func holdable(uncached, hold int64) bool { return hold > 0 && uncached >= hold }

// queued is the uncached tokens of q's prompts.
func queued(q []twinEntry) float64 {
	var n int64
	for i := range q {
		n += q[i].uncached
	}
	return float64(n)
}

// holding reports whether a queued prompt is held in the picker still.
func (w *twin) holding() bool {
	for i := range w.q {
		if w.q[i].waiting() {
			return true
		}
	}
	return false
}

// remove drops a request that ended without a first token.
func (w *twin) remove(seq uint64) {
	if i := slices.IndexFunc(w.q, func(e twinEntry) bool { return e.seq == seq }); i >= 0 {
		w.q = slices.Delete(w.q, i, i+1)
		w.version++
	}
	if len(w.q) == 0 {
		w.start = 0
	}
}

// project sets *out to the prediction of the first token of a request
// with cached and uncached prompt tokens routed at now: the summed step
// shapes from the twin's step in progress to its first token, and when
// that step began (in place: the sample is some 200 bytes, and the twin
// projects once per candidate). The twin must have advanced to now.
func (w *twin) project(out *twinSample, now int64, cached, uncached, hold int64, eng Engine, ends outputs, budget int64, theta *[maxFeatures]float64) {
	held := w.holds(max(1, uncached), hold)
	w.scratch = append(w.scratch[:0], w.q...)
	w.scratch = append(w.scratch, twinEntry{routed: now, cached: cached, uncached: max(1, uncached), held: held})
	q := w.scratch
	last := &q[len(q)-1]
	t := w.start
	if t == 0 {
		t = now
		// Nothing of ours queued: a decoding server is in the step that
		// began at its last step end.
		if real := eng.stepEnd(); eng.Decodes > 0 && real > 0 && real <= now && now-real < maxTwinLag {
			t = real
		}
	}
	*out = twinSample{ok: true, at: now, start: t, tracked: queued(q[:len(q)-1])}
	// Prompts finish in FCFS order: the finished prefix of q decodes, and
	// is carried in eng rather than walked at every step. freed is the
	// sequences expected to have finished since the decision, whose
	// places in a full batch go to waiting prompts (completions.go); they
	// matter only where the batch can fill.
	clock := &w.clock
	clock.start(w, eng.Steps, ends, fills(eng, len(q)-1))
	head := 0
	freed := 0.0
	for step := 0; step < maxTwinSteps; step++ {
		for head < len(q)-1 && q[head].done >= q[head].uncached {
			eng.Decodes++
			eng.DecodeTokens += float64(q[head].cached + q[head].uncached)
			clock.begins(step-1, q[head].bound)
			head++
		}
		q := q[head:]
		var alone stepShape
		admitting := last.done == 0
		if admitting {
			// The step as the queue alone runs it: what the request's
			// first chunk, if this step takes it, lengthens.
			alone, _ = schedule(q[:len(q)-1], t, eng.Decodes, eng.DecodeTokens, freed, budget, false, 0)
		}
		s, _ := schedule(q, t, eng.Decodes, eng.DecodeTokens, freed, budget, true, len(q))
		if s.empty() {
			next := nextArrival(q, t)
			if next == 0 {
				break // cannot happen: the new entry is pending
			}
			t = next
			continue
		}
		if admitting && last.done > 0 && alone.finishing > 0 {
			out.imposed = imposedBy(theta, &alone, &s)
		}
		if last.done >= last.uncached {
			out.finish(step, s, w.join, now, t, budget, theta)
			return
		}
		x := s.x(theta)
		out.add(step, &x)
		d := nanos(dot(theta, &x))
		t += d
		freed = clock.after(step, eng.Decodes)
		// A full batch whose step computed no prompt admits nobody until
		// places free: the steps until then repeat this one, and are
		// added without scheduling the queue again (at chat ×32 a
		// projection waits some 150 steps for a wave).
		for s.tokens == s.seqs && s.finishing == 0 && math.Ceil(s.seqs-freed) >= maxRunning && step+1 < maxTwinSteps {
			step++
			out.add(step, &x)
			t += d
			freed = clock.after(step, eng.Decodes)
		}
	}
	*out = twinSample{} // beyond the bound: the feature model predicts
}

// finish takes the step that computes the request's last chunk, s,
// beginning at t (iteration it), into the sample, and prices the prompts
// expected to arrive by then (join, as of now) in the room it leaves.
func (o *twinSample) finish(it int, s stepShape, join joinRate, now, t, budget int64, theta *[maxFeatures]float64) {
	x := s.x(theta)
	o.add(it, &x)
	o.last, o.hindsight = s, o.x
	with := s
	join.into(&with, now, t-now, budget-int64(s.tokens))
	if with.tokens > s.tokens {
		xw := with.x(theta)
		o.joiners = max(0, dot(theta, &xw)-dot(theta, &x))
	}
}

// twinPrediction is the TTFT the published fit c predicts from a twin
// sample: the twin's, and the expected joiners at their learned weight.
func (c *coeffs) twinPrediction(s *twinSample) float64 {
	return twinTTFT(&c.twin, s) + c.join*s.joiners
}

// twinTTFT is a twin sample's TTFT under theta: the rest of the step in
// progress at the decision and the steps after it. When that step is
// overdue by the fitted cost (the twin holds a step that would finish a
// prompt until its first token comes), the projection's steps between its
// fitted end and the decision count too (the request joins only a step
// that starts after its decision): they stand for the overdue step's
// unknown rest, an estimate as long as its overrun. Ending the overdue
// step at the decision instead measured worse (TTFT MAPE on the Poisson
// trace ×2: 14.9 % against 5.5 %).
func twinTTFT(theta *[maxFeatures]float64, s *twinSample) float64 {
	total, first := dot(theta, &s.x), dot(theta, &s.first)
	ran := float64(s.at-s.start) / 1e9
	return math.Max(0, first-ran) + total - first
}

// Routed records a request routed to addr at `at` with cached and uncached
// prompt tokens there, that asked for at most bound output tokens (0: no
// bound), into the endpoint's twin. The ticket it returns names the
// request in FirstTokenAt and Ended.
func (m *Model) Routed(addr string, at time.Time, cached, uncached, bound int) Ticket {
	e := m.fitOf(addr)
	seq := m.tickets.Add(1)
	e.twinMu.Lock()
	defer e.twinMu.Unlock()
	if !e.tw.routed(seq, at.UnixNano(), int64(max(0, cached)), int64(uncached), m.cfg.HoldTokens, int64(max(0, bound))) {
		return Ticket{addr: addr, open: true}
	}
	return Ticket{addr: addr, seq: seq, open: true}
}

// Ticket is a routed request's place in its endpoint's twin, owned by the
// request; the zero Ticket is none.
type Ticket struct {
	addr string
	seq  uint64 // 0: not in the queue (it was full)
	open bool
	// decoding is set by the first token: the request is in the twin's
	// calendar (if it had a bound) until Ended.
	decoding bool
}

// FirstTokenAt takes the request's first token at `at` into its
// endpoint's twin (eng: the endpoint's state then) and completes s, the
// request's sample from Model.Sample, with what it learned in hindsight.
// Later calls do nothing; Ended after it ends the decode.
func (m *Model) FirstTokenAt(t *Ticket, at time.Time, eng Engine, s *Sample) {
	if t == nil || t.decoding {
		return
	}
	e := m.closeTicket(t)
	if e == nil {
		return
	}
	defer e.twinMu.Unlock()
	t.open, t.decoding = true, true
	var ts *twinSample
	if s != nil {
		ts = &s.twin
	}
	e.tw.firstToken(t.seq, at.UnixNano(), ts, eng, m.cfg.TokenBudget, &m.twinCoeffs(e).twin)
}

// Ended takes a request that ended, before its first token or after it,
// out of its endpoint's twin. Later calls, and Finished, do nothing.
func (m *Model) Ended(t *Ticket) { m.end(t) }

// end is Ended, returning the calendar entry of a decoding request that
// had one.
func (m *Model) end(t *Ticket) (decoding, bool) {
	e := m.closeTicket(t)
	if e == nil {
		return decoding{}, false
	}
	defer e.twinMu.Unlock()
	if t.decoding {
		return e.tw.finished(t.seq)
	}
	e.tw.remove(t.seq)
	return decoding{}, false
}

// closeTicket closes t and returns its endpoint's fit with twinMu held,
// or nil when there is nothing more to do (closed before, forgotten, or
// a request the full queue did not hold, now counted out).
func (m *Model) closeTicket(t *Ticket) *fit {
	if t == nil || !t.open {
		return nil
	}
	t.open = false
	e := (*m.endpoints.Load())[t.addr]
	if e == nil {
		return nil // forgotten
	}
	e.twinMu.Lock()
	if t.seq == 0 {
		e.tw.untracked = max(0, e.tw.untracked-1)
		e.twinMu.Unlock()
		return nil
	}
	return e
}

// twinCoeffs is the fit whose step cost the endpoint's twin uses: its own
// once it has MinSamples, else the pool's.
func (m *Model) twinCoeffs(e *fit) *coeffs {
	if c := e.published.Load(); c.twinSamples >= m.cfg.MinSamples {
		return c
	}
	return m.pool.published.Load()
}

// PredictLive is Predict with the engine twin: when the picker knows the
// endpoint's whole queue, TTFT (mean and quantile) is the twin's
// projection of the request's first token (the feature model's TTFT is
// then not computed). f.Prefill and f.Cached are the request's uncached and
// cached prompt tokens there.
func (m *Model) PredictLive(addr string, f *Features, now time.Time, eng Engine) Estimate {
	return m.predictLive((*m.endpoints.Load())[addr], f, now, eng)
}

// predictTTFT sets *est to PredictLive's TTFT on the endpoint whose fit
// is e (nil: none), from its published fit own and the pool's
// (predictLive), at now (Unix nanoseconds); est's other fields are
// zeroed. Results go through pointers and the arguments fit in registers:
// it runs once per candidate per decision.
func (m *Model) predictTTFT(e *fit, own, pool *coeffs, f *Features, now int64, eng *Engine, est *Estimate) {
	*est = Estimate{}
	if eng.External == 0 {
		c := m.enough(own, pool, own.twinSamples)
		var s twinSample
		m.projectInto(&s, e, c, f, now, *eng)
		// The twin once it has learned, and also while nothing has: its
		// prior step cost (twinPrior) is an 8B model's roofline, the
		// feature model's prior only a line, and a first burst is
		// predicted before any first token (a 36k-token prompt: 1.8 s by
		// the twin's prior, 3.7 s by the line's; the engine took 1.6 s).
		// That needs the twin to know all of the backlog: charges it was
		// not told of (a P/D prefill charged here) are the feature
		// model's to price.
		if s.ok && (c.twinSamples >= m.cfg.MinSamples ||
			m.enough(own, pool, own.ttftSamples).ttftSamples < m.cfg.MinSamples && s.tracked >= f.Backlog) {
			ttft := c.twinPrediction(&s)
			est.TTFT, est.TTFTQuantile = seconds(ttft), seconds(ttft*c.mTwin)
			if s.imposed > 0 {
				est.Imposed = seconds(s.imposed)
			}
			return
		}
	}
	est.TTFT, est.TTFTQuantile = m.enough(own, pool, own.ttftSamples).ttftOf(f)
}

// enough is own when it has learned from MinSamples (its count of the
// kind in question), else pool.
func (m *Model) enough(own, pool *coeffs, samples int) *coeffs {
	if samples >= m.cfg.MinSamples {
		return own
	}
	return pool
}

// Sample is what the model learns from when a routed request's first
// token comes: its features on the endpoint it went to and the engine
// twin's projection at the decision. Only the chosen candidate's is kept,
// so PredictLive, once per candidate, does not record it.
type Sample struct {
	Features
	twin twinSample
}

// Sample is the projection PredictLive made for the request with
// features f at now on addr (eng as then), for FirstTokenAt and
// ObserveFirstToken; call it before Routed, which queues the request.
func (m *Model) Sample(addr string, f Features, now time.Time, eng Engine) Sample {
	return Sample{Features: f, twin: m.project((*m.endpoints.Load())[addr], &f, now.UnixNano(), eng)}
}

// project is the twin's projection of a request with features f at n on
// the endpoint with fit e (nil: none yet), not ok where the twin does not
// answer (traffic the picker did not route, a queue beyond its bound).
func (m *Model) project(e *fit, f *Features, n int64, eng Engine) twinSample {
	var s twinSample
	if eng.External > 0 {
		return s
	}
	c := m.pool.published.Load()
	if e != nil {
		c = m.twinCoeffs(e)
	}
	m.projectInto(&s, e, c, f, n, eng)
	return s
}

// projectInto is project into s with the step cost c.
func (m *Model) projectInto(s *twinSample, e *fit, c *coeffs, f *Features, n int64, eng Engine) {
	if e == nil {
		// Nothing routed there yet: an empty queue (a prediction creates
		// no per-endpoint state).
		var idle twin
		var buf [1]twinEntry
		idle.scratch = buf[:0]
		idle.project(s, n, int64(f.Cached), int64(f.Prefill), m.cfg.HoldTokens, eng, c.ends, m.cfg.TokenBudget, &c.twin)
		return
	}
	e.twinMu.Lock()
	defer e.twinMu.Unlock()
	if e.tw.untracked > 0 {
		return
	}
	e.tw.advance(n, eng, m.cfg.TokenBudget, &c.twin, true)
	// The trajectory is the queue's own schedule; it does not retire
	// sequences, which matters only where the batch can fill (and then it
	// is not computed).
	if !fills(eng, len(e.tw.q)) {
		if tr := e.tw.trajectory(eng, m.cfg.TokenBudget, &c.twin); tr != nil {
			*s = tr.project(e.tw.start, n, int64(f.Cached), int64(f.Prefill), e.tw.holds(max(1, int64(f.Prefill)), m.cfg.HoldTokens), e.tw.join, m.cfg.TokenBudget, &c.twin)
			return
		}
	}
	e.tw.project(s, n, int64(f.Cached), int64(f.Prefill), m.cfg.HoldTokens, eng, c.ends, m.cfg.TokenBudget, &c.twin)
}

// ObserveFirstToken learns from a request whose first token came at `at`:
// the feature model from its TTFT, and, when its features f carry a twin
// projection, the twin's step cost from the time since the decision
// (served: a flow-control queue's wait before the decision is none of the
// server's, and the projection starts at the decision).
// The residuals are the decision's (their quantile must cover what it
// could not know), the step cost is learned from the hindsight shapes.
func (m *Model) ObserveFirstToken(addr string, f Sample, at time.Time, ttft, served time.Duration) {
	if !f.twin.ok || served <= 0 {
		m.ObserveTTFT(addr, f.Features, ttft)
		return
	}
	y := float64(at.UnixNano()-f.twin.start) / 1e9
	m.pool.observeFirst(f, ttft.Seconds(), y, served.Seconds())
	if e := m.fitOf(addr); e != nil {
		e.used.Store(m.observations.Add(1))
		e.observeFirst(f, ttft.Seconds(), y, served.Seconds())
	}
}

// observeFirst learns a first token in both TTFT models and publishes the
// fit once: actual for the feature model (skipped when not positive), and
// for the twin y, the time from the projection's start to the first token,
// and served, the TTFT the projection predicted.
func (f *fit) observeFirst(feat Sample, actual, y, served float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if actual > 0 {
		f.learnLocked(ttft, feat.Features, actual)
	}
	s := &feat.twin
	t := &f.t[twinCost]
	if p := f.published.Load().twinPrediction(s); p > 0 {
		t.q.observe(math.Log(served / p))
		f.learnJoinLocked(s.joiners, p, served)
	}
	t.reg.updateRel(&s.hindsight, y, served, twinHuber)
	t.samples++
	f.publishKindsLocked(1<<ttft | 1<<twinCost)
}
