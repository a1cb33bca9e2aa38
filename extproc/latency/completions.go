package latency

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

// outputForget is the per-completion weight of a new output length once
// the first few have been averaged.
const outputForget = 0.01

// outputMean is a running mean of output lengths.
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

// fills reports whether the batch can reach maxRunning in a projection:
// eng's decoding sequences, a queue of n prompts and the request.
func fills(eng Engine, n int) bool {
	return eng.Decodes+float64(n)+1 >= maxRunning
}

// ObserveOutput learns the output length of a response completed on addr.
func (m *Model) ObserveOutput(addr string, tokens int) {
	if tokens <= 0 {
		return
	}
	m.pool.observeOutput(float64(tokens))
	if e := m.fitOf(addr); e != nil {
		e.observeOutput(float64(tokens))
	}
}

func (f *fit) observeOutput(tokens float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.output.observe(tokens)
	f.publishKindsLocked(0)
}
