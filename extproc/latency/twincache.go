package latency

// The projection cache. A projection appends the request to the queue and
// schedules until its first token: O(queue) per step, and a decision makes
// one per candidate — under a burst, many decisions in a row on queues that
// did not change between them. The request comes last (FCFS), so until the
// step that admits its first chunk the schedule is the queue's own, which
// does not depend on the request: that trajectory (each step's start,
// shape, summed cost terms, and the budget it leaves) is computed once per
// state of the twin and kept. A projection then finds the first step that
// starts after the decision with budget left over (a binary search), adds
// the request's chunk to it, and prices the request's own remaining chunks,
// which it computes alone (every prompt ahead of it finished in the step
// that admitted it). The result is the uncached projection's, bit for bit
// (TestProjectionCacheMatches).
//
// The trajectory is valid while the queue, the twin's clock, the decode
// batch and the step cost are those it was computed from; a twin's
// version counts the queue's changes (the clock moves whenever a step is
// applied). It also answers the twin's clock check (has the step in
// progress ended?) without scheduling the queue.

// maxBaseSteps bounds a cached trajectory (about 22 KB per endpoint with a
// queue); a longer one is not kept (the projection is computed as without
// the cache).
const maxBaseSteps = 128

// baseStep is one iteration of the queue's own schedule.
type baseStep struct {
	t     int64 // its start
	empty bool  // nothing to run: the clock jumped to the next arrival
	s     stepShape
	x     [maxFeatures]float64 // s.x(theta)
	// sum is x summed over the non-empty iterations before this one.
	sum [maxFeatures]float64
	// left is what the step leaves for an entry after the queue.
	left slot
	// next is the first iteration from this one whose slot is open
	// (len(steps): none).
	next int
}

// trajectory is a twin's queue scheduled alone, from its clock until every
// prompt is computed.
type trajectory struct {
	valid bool
	// The state it was computed from.
	version               uint64
	start                 int64
	decodes, decodeTokens float64
	theta                 *[maxFeatures]float64
	steps                 []baseStep
	// After the last step (at iteration len(steps)): the clock, the
	// decode batch with every prompt of the queue in it, and the summed
	// cost terms.
	end        int64
	dAll, cAll float64
	sum        [maxFeatures]float64
	// tracked is the queue's uncached tokens (twinSample.tracked).
	tracked float64
}

// of reports whether tr was computed from the twin's current state.
func (tr *trajectory) of(w *twin, eng Engine, theta *[maxFeatures]float64) bool {
	return tr.valid && tr.version == w.version && tr.start == w.start && tr.decodes == eng.Decodes &&
		tr.decodeTokens == eng.DecodeTokens && tr.theta == theta
}

// trajectory returns the twin's trajectory under eng and theta, computing
// it when the state changed; nil when the queue is empty or its schedule
// is longer than maxBaseSteps.
func (w *twin) trajectory(eng Engine, budget int64, theta *[maxFeatures]float64) *trajectory {
	tr := &w.traj
	if len(w.q) == 0 || w.noCache || w.holding() {
		// A held prompt goes when no prompt is in prefill, the request's
		// own included: the queue's schedule depends on the request.
		return nil
	}
	if tr.of(w, eng, theta) {
		return tr
	}
	*tr = trajectory{version: w.version, start: w.start, decodes: eng.Decodes, decodeTokens: eng.DecodeTokens,
		theta: theta, steps: tr.steps[:0]}
	w.scratch = append(w.scratch[:0], w.q...)
	q := w.scratch
	tr.tracked = queued(q)
	t := w.start
	var sum [maxFeatures]float64
	head := 0
	// The loop mirrors project's without the request (an iteration here
	// is an iteration there until the request is admitted).
	for range maxBaseSteps + 1 {
		for head < len(q) && q[head].done >= q[head].uncached {
			eng.Decodes++
			eng.DecodeTokens += float64(q[head].cached + q[head].uncached)
			head++
		}
		if head == len(q) {
			tr.end, tr.dAll, tr.cAll, tr.sum = t, eng.Decodes, eng.DecodeTokens, sum
			tr.valid = true
			break
		}
		if len(tr.steps) == maxBaseSteps {
			break
		}
		rest := q[head:]
		s, left := schedule(rest, t, eng.Decodes, eng.DecodeTokens, 0, budget, true, len(rest))
		st := baseStep{t: t, s: s, left: left, sum: sum}
		if s.empty() {
			next := nextArrival(rest, t)
			if next == 0 {
				break // nothing would ever run: project gives up too
			}
			st.empty = true
			tr.steps = append(tr.steps, st)
			t = next
			continue
		}
		st.x = s.x(theta)
		for k := range sum {
			sum[k] += st.x[k]
		}
		t += nanos(dot(theta, &st.x))
		tr.steps = append(tr.steps, st)
	}
	if !tr.valid {
		return nil
	}
	next := len(tr.steps)
	for j := len(tr.steps) - 1; j >= 0; j-- {
		if tr.steps[j].left.open {
			next = j
		}
		tr.steps[j].next = next
	}
	return tr
}

// project is twin.project for a request routed at now, from the
// trajectory of the twin whose clock starts at start; held is whether the
// picker holds the request, join the twin's joiners.
func (tr *trajectory) project(start, now int64, cached, uncached int64, held bool, join joinRate, budget int64, theta *[maxFeatures]float64) twinSample {
	uncached = max(1, uncached)
	out := twinSample{ok: true, at: now, start: start, tracked: tr.tracked}
	steps := tr.steps
	if len(steps) > 0 && !steps[0].empty {
		out.first = steps[0].x
	}
	j := len(steps)
	if !held {
		// A held request is admitted only after every prompt ahead is
		// computed: each step of the trajectory computes one of them.
		if j = firstFrom(steps, now); j < len(steps) {
			j = steps[j].next
		}
	}
	var s stepShape
	var n, t int64
	it := j
	if j < len(steps) {
		// Admitted into a step of the queue's own schedule.
		st := &steps[j]
		s, out.x, t = st.s, st.sum, st.t
		n = min(uncached, st.left.room)
		if st.s.finishing > 0 {
			w := st.s
			w.add(n, cached, n >= uncached)
			out.imposed = imposedBy(theta, &st.s, &w)
		}
	} else {
		// Admitted after every prompt ahead is computed: the steps until
		// the decision decode alone (the twin's step in progress is
		// overdue), or the clock waits for it.
		t = tr.end
		out.x = tr.sum
		dec := stepShape{tokens: tr.dAll, seqs: tr.dAll, ctx: tr.cAll, attn: tr.cAll + tr.dAll}
		for ; t < now; it++ {
			if it >= maxTwinSteps {
				return twinSample{}
			}
			if dec.empty() {
				t = now
				continue
			}
			x := dec.x(theta)
			out.add(it, &x)
			t += nanos(dot(theta, &x))
		}
		if held && !dec.empty() {
			// It reaches the server after the step that begins at the
			// last first token ahead has begun (schedule's clear).
			x := dec.x(theta)
			out.add(it, &x)
			t += nanos(dot(theta, &x))
			it++
		}
		if it >= maxTwinSteps {
			return twinSample{}
		}
		room := budget - int64(tr.dAll)
		if room <= 0 || int(tr.dAll) >= maxRunning {
			return twinSample{} // never admitted: project runs out of steps
		}
		s, n = dec, min(uncached, room)
	}
	done := int64(0)
	for {
		s.add(n, cached+done, done+n >= uncached)
		done += n
		if done >= uncached {
			out.finish(it, s, join, now, t, budget, theta)
			return out
		}
		x := s.x(theta)
		out.add(it, &x)
		t += nanos(dot(theta, &x))
		// The rest is computed alone beside the whole decode batch.
		it++
		room := budget - int64(tr.dAll)
		if it >= maxTwinSteps || room <= 0 || int(tr.dAll) >= maxRunning {
			return twinSample{}
		}
		s = stepShape{tokens: tr.dAll, seqs: tr.dAll, ctx: tr.cAll, attn: tr.cAll + tr.dAll}
		n = min(uncached-done, room)
	}
}

// add takes iteration it's cost terms x into the sample.
func (o *twinSample) add(it int, x *[maxFeatures]float64) {
	for k := range o.x {
		o.x[k] += x[k]
	}
	if it == 0 {
		o.first = *x
	}
}

// firstFrom is the first of steps starting at or after t (their starts
// increase), len(steps) when none does.
func firstFrom(steps []baseStep, t int64) int {
	lo, hi := 0, len(steps)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if steps[m].t < t {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}
