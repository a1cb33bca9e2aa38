package latency

import "math"

// The requests routed after a decision that share its last step. A
// prompt's first token ends the step that computes its last chunk, and
// that step's leftover budget goes to the prompts that reached the server
// before it began. Under steady load these are not rare: at chat ×32 every
// server receives a few short turns during each step, the next step
// computes them all, and a turn routed early in a step is joined by the
// ones routed after it in more than half of the cases, its step
// lengthened by theirs. A decision cannot know who comes, but it knows how
// many tokens of joinable prompts the server has been receiving per
// second, and the time until its own last step begins: the projection
// adds the expected arrivals of that wait to the last step, as chunks
// shaped like the recent ones and within the room the step leaves.
//
// Only prompts that can join count: under a prefill-join-hold a long one
// routed while a prompt is in prefill waits in the picker until none is,
// so it never shares another prompt's last step.
//
// The expectation prices what happens on average, which the learning must
// not see as the step's cost: the sample's hindsight (what the step cost
// is fitted from) has the joiners that really came instead.

// joinTau is the time constant of the arrival rate: long enough to average
// a few bursts, short enough to follow a load that ramps over seconds.
const joinTau = float64(1e9) // ns

// joinRate is the recent arrival of joinable prompts at one endpoint: the
// shape terms a step would gain from them, summed with exponential decay
// as of the instant at (unix ns).
type joinRate struct {
	at                      int64
	tokens, attn, ctx, seqs float64
}

// add takes a prompt of cached and uncached tokens routed at `at`.
func (j *joinRate) add(at, cached, uncached int64) {
	j.decay(at)
	var s stepShape
	s.add(uncached, cached, true)
	j.tokens += s.tokens
	j.attn += s.attn
	j.ctx += s.ctx
	j.seqs += s.seqs
}

// decay brings the sums to t.
func (j *joinRate) decay(t int64) {
	if t <= j.at {
		return
	}
	if j.tokens != 0 {
		f := math.Exp(-float64(t-j.at) / joinTau)
		j.tokens, j.attn, j.ctx, j.seqs = j.tokens*f, j.attn*f, j.ctx*f, j.seqs*f
	}
	j.at = t
}

// into adds to s the prompts expected to arrive within wait ns after
// now, as of the sums j holds (j itself is not changed), at most room
// tokens of them. The expected joiners are not counted as finishing: no
// prediction is made for them here.
func (j joinRate) into(s *stepShape, now, wait, room int64) {
	// The sums only decay: below the median count undecayed, no need to
	// decay them (an exponential per candidate) to know.
	if wait <= 0 || room <= 0 || j.seqs*float64(wait)/joinTau <= math.Ln2 {
		return
	}
	j.decay(now)
	// The median count of arrivals rather than their mean: a Poisson
	// count's median is about its mean less ln 2, so a join that is less
	// likely than not adds nothing (its MAPE-optimal price, where a join
	// would lengthen the step several times, is none).
	f := float64(wait) / joinTau
	mu := j.seqs * f
	if mu <= math.Ln2 {
		return
	}
	f *= (mu - math.Ln2) / mu
	if n := j.tokens * f; n > float64(room) {
		f *= float64(room) / n
	}
	s.tokens += j.tokens * f
	s.attn += j.attn * f
	s.ctx += j.ctx * f
	s.seqs += j.seqs * f
}

// The joiners' weight is learned online for MAPE: each first token whose
// prediction priced joiners moves it by joinStep times the share of the
// TTFT they made, down when the prediction was over, up when under (the
// gradient's sign of |p − y| / y). Where joins rarely come (a bursty
// trace's long prompts are held, and short ones seldom meet), it falls
// to zero; where every step has them (chat ×32), it settles where over-
// and under-predictions balance.
const (
	joinPrior = 1.0
	joinStep  = 0.02
	maxJoin   = 2.0
)

// learnJoinLocked moves f's joiners' weight by a first token: joiners the
// seconds its prediction p priced at weight 1, served the TTFT.
func (f *fit) learnJoinLocked(joiners, p, served float64) {
	if joiners <= 0 || served <= 0 || p == served {
		return
	}
	step := joinStep * joiners / served
	if p > served {
		step = -step
	}
	f.join = min(maxJoin, max(0, f.join+step))
}
