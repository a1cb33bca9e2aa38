package latency

import "slices"

// The running batch's completions. vLLM runs at most max_num_seqs
// sequences (maxRunning); past that a waiting prompt is admitted only as a
// running one finishes. Overloaded, a server's queue waits on its
// completions, not on its compute: at chat ×32, seed 2, turns waited 1–4 s
// behind full batches for prefills of 40 ms, and a twin that admits nobody
// while the batch is full gave such requests up to the feature model. The
// projection now frees, after every step, each decoding sequence's chance
// of having finished in it, one over the endpoint's mean output length
// (learned from completed responses, ObserveOutput); waiting prompts take
// the freed places in FCFS order. Nothing is assumed before a completion
// is seen. The freed places count only for admission: in a full batch a
// finished sequence's place is taken by the next prompt, so the step
// costs what it did.
//
// A mean rate frees a full batch's places evenly, but a batch filled in a
// burst finishes in a wave: the chat turns of chat ×32 all run 200 tokens,
// so the places a burst took free together some 200 steps later, and a
// queue behind them waits for that wave, not for one place a step (seed 2:
// waits predicted 2.3× short). Where the request said how long it may run
// (max_tokens), the twin therefore keeps the sequence from its first token
// to its end (a calendar of at most maxDecoding) and times its end: its
// tokens so far are the server's steps since its first token (the step
// clock counts them from the chunks it relays) times the tokens per
// counted step the endpoint's completed streams showed (Finished), its
// expected length its bound times the share of their bound the
// endpoint's responses use (learned; 1 where servers run to max_tokens,
// less where they stop at EOS). A projection orders the steps each has
// left in a min-heap and pops them as its steps pass. Sequences without a
// bound, or before the share is learned, retire at the mean rate as
// before.

// outputForget is the per-completion weight of a new output length once
// the first few have been averaged.
const outputForget = 0.01

// maxDecoding bounds an endpoint's calendar of decoding sequences; past it
// the rest retire at the mean rate.
const maxDecoding = 2 * maxRunning

// outputMean is a running mean of output lengths (or of their share of
// max_tokens).
type outputMean struct {
	n, mean float64
}

func (o *outputMean) observe(tokens float64) {
	o.n++
	o.mean += max(1/o.n, outputForget) * (tokens - o.mean)
}

// retire is the share of a decoding batch expected to finish per step:
// one over the mean output length (a prior, until the first completion
// replaces it), 0 while there is none.
func (o *outputMean) retire() float64 {
	if o.mean < 1 {
		return 0
	}
	return 1 / o.mean
}

// outputs is how a fit's responses end: the mean rate (retire), the
// share of max_tokens they use (bounded; 0 before one was seen), and the
// tokens a stream produces per step the step clock counts (perStep; 0
// before one was seen, taken as 1: every token a chunk of its own, as
// vLLM streams by default; more where chunks carry several tokens or
// steps go uncounted).
type outputs struct {
	retire, bounded, perStep float64
}

// decoding is a sequence the twin routed, past its first token, with the
// max_tokens it asked for.
type decoding struct {
	seq   uint64
	first uint32 // the server's step count at its first token
	bound int64
}

// left is the steps after the one in progress a sequence with tokens of
// its bound produced is expected to run, from out's share: after the
// projection's step left it has finished (its last token came in it). One
// past its expected length it is due at every step, as half its bound's
// rest would say on average.
func (o outputs) left(tokens, bound float64) float64 {
	if r := o.bounded*bound - tokens - 1; r >= 0 {
		return r
	}
	return max(0, (bound-tokens)/2-1)
}

// stale reports whether a calendar entry is past any end its bound
// allows (its end was not reported: only a bound, never relied on).
func stale(tokens, bound float64) bool { return tokens > 2*bound+64 }

// completionClock is a projection's account of the sequences finished
// since the decision: those of the calendar by their steps left (a
// min-heap), the rest at the mean rate.
type completionClock struct {
	heap    []float64
	out     outputs
	timed   int     // sequences the heap holds or held
	popped  int     // of them, finished
	rest    float64 // of the others, expected finished
	enabled bool
}

// start fills the clock from w's calendar when the batch can fill, the
// server's step count being steps; without a count or a learned share it
// only counts at the mean rate. Calendar entries past their bound are
// dropped.
func (c *completionClock) start(w *twin, steps uint32, out outputs, fills bool) {
	*c = completionClock{heap: c.heap[:0], out: out}
	if !fills || steps == 0 || out.bounded <= 0 {
		return
	}
	c.enabled = true
	rate := out.perStep
	if rate <= 0 {
		rate = 1
	}
	kept := w.dec[:0]
	for _, d := range w.dec {
		tokens := 1 + stepsSince(steps, d.first)*rate
		if stale(tokens, float64(d.bound)) {
			continue
		}
		kept = append(kept, d)
		c.heap = append(c.heap, out.left(max(1, tokens), float64(d.bound)))
	}
	w.dec = kept
	c.timed = len(c.heap)
	for i := len(c.heap)/2 - 1; i >= 0; i-- {
		c.down(i)
	}
}

// stepsSince is the steps the count moved from then to now, modulo 2³²
// as the count; 0 where now is behind then: a decision reads the count
// before it takes twinMu, and a first token recorded in between is
// later. Read as 2³² less a step, such an entry was dropped as stale.
func stepsSince(now, then uint32) float64 { return float64(max(0, int32(now-then))) }

// begins adds a queued prompt whose first token came at the end of
// projection step at, asking for bound tokens (0: unknown).
func (c *completionClock) begins(at int, bound int64) {
	if !c.enabled || bound <= 0 {
		return
	}
	c.heap = append(c.heap, float64(at)+c.out.left(1, float64(bound)))
	c.timed++
	for i := len(c.heap) - 1; i > 0; {
		p := (i - 1) / 2
		if c.heap[p] <= c.heap[i] {
			break
		}
		c.heap[p], c.heap[i] = c.heap[i], c.heap[p]
		i = p
	}
}

// after counts the sequences finished in projection step j out of
// decodes decoding, and returns how many have finished since the
// decision.
func (c *completionClock) after(j int, decodes float64) float64 {
	for len(c.heap) > 0 && c.heap[0] <= float64(j) {
		n := len(c.heap) - 1
		c.heap[0] = c.heap[n]
		c.heap = c.heap[:n]
		c.down(0)
		c.popped++
	}
	untimed := max(0, decodes-float64(c.timed))
	c.rest = min(untimed, c.rest+untimed*c.out.retire)
	return min(decodes, float64(c.popped)+c.rest)
}

func (c *completionClock) down(i int) {
	h := c.heap
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		if r := l + 1; r < len(h) && h[r] < h[l] {
			l = r
		}
		if h[i] <= h[l] {
			return
		}
		h[i], h[l] = h[l], h[i]
		i = l
	}
}

// decodes puts a routed request's first token, at the server's step
// count steps, into the calendar when it asked for a bound and there is
// room.
func (w *twin) decodes(e *twinEntry, steps uint32) {
	if e.bound > 0 && len(w.dec) < maxDecoding {
		w.dec = append(w.dec, decoding{seq: e.seq, first: steps, bound: e.bound})
	}
}

// finished takes a decoding sequence out of the calendar and returns it.
func (w *twin) finished(seq uint64) (decoding, bool) {
	i := slices.IndexFunc(w.dec, func(d decoding) bool { return d.seq == seq })
	if i < 0 {
		return decoding{}, false
	}
	d := w.dec[i]
	w.dec[i] = w.dec[len(w.dec)-1]
	w.dec = w.dec[:len(w.dec)-1]
	return d, true
}

// Finished is Ended for a request whose response completed with tokens
// output tokens over seqs sequences (OpenAI's n choices; below 1 counts
// as 1), the server's step count then being steps: a stream that was in
// the calendar teaches how many tokens a sequence produces there per step
// counted. The server runs each choice as a sequence of its own, every
// one producing a token in the same steps, so the tokens a step counted
// are the usage's (summed over the choices) shared among them: read
// whole, a stream of n choices taught n times a sequence's rate.
func (m *Model) Finished(t *Ticket, steps uint32, tokens, seqs int) {
	d, ok := m.end(t)
	seqs = max(1, seqs)
	if !ok || tokens < 2*seqs {
		return
	}
	n := stepsSince(steps, d.first)
	if n == 0 {
		return
	}
	perStep := float64(tokens-seqs) / (float64(seqs) * n)
	m.pool.observePerStep(perStep)
	if e := m.fitOf(t.addr); e != nil {
		e.observePerStep(perStep)
	}
}

func (f *fit) observePerStep(tokens float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.perStep.observe(tokens)
	f.publishKindsLocked(0)
}

// fills reports whether the batch can reach maxRunning in a projection:
// eng's decoding sequences, a queue of n prompts and the request.
func fills(eng Engine, n int) bool {
	return eng.Decodes+float64(n)+1 >= maxRunning
}

// ObserveOutput learns the output length of a response completed on addr
// with tokens over seqs sequences (n choices; below 1 counts as 1), each
// asked for at most bound tokens (0: no bound): the twin frees a batch's
// places by the sequences' lengths, and max_tokens bounds each choice.
func (m *Model) ObserveOutput(addr string, tokens, seqs, bound int) {
	if tokens <= 0 {
		return
	}
	perSeq := float64(tokens) / float64(max(1, seqs))
	m.pool.observeOutput(perSeq, bound)
	if e := m.fitOf(addr); e != nil {
		e.observeOutput(perSeq, bound)
	}
}

func (f *fit) observeOutput(tokens float64, bound int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.output.observe(tokens)
	if bound > 0 {
		f.bounded.observe(min(1, tokens/float64(bound)))
	}
	f.publishKindsLocked(0)
}
