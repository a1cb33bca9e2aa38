package async

import (
	"context"
	"math"
	"time"
)

// Queue is what one poll round reads from and hands on to. The Redis
// processor implements it over a request sorted set; the cluster benchmark
// over a batch job on its virtual clock, so that both dispatch by the same
// gate logic (Poll).
type Queue interface {
	// Pop removes and returns the earliest-deadline message; nil when the
	// queue is empty.
	Pop(ctx context.Context) (*Envelope, error)
	// Requeue puts a refused message back under its deadline.
	Requeue(ctx context.Context, m *Envelope) error
	// Expire drops a message popped after its deadline. llm-d-async drops
	// these at dequeue without a result (a producer waiting for one knows
	// the deadline it set).
	Expire(ctx context.Context, m *Envelope)
	// Dispatch hands an admitted message on; release must be called once
	// when its result is final or it leaves for a queue again. Dispatch may
	// block (the workers are busy): that is the loop's back-pressure.
	Dispatch(ctx context.Context, m *Envelope, release func()) error
}

// Round is what one poll did.
type Round struct {
	Budget float64
	// Take is floor(batchSize × Budget): how many messages the round may pop.
	Take                                 int
	Popped, Dispatched, Refused, Expired int
	GateErrors                           int
}

// Poll runs one round of llm-d-async's dispatch loop over q at now: read
// the gate's budget, pop up to floor(batchSize × budget) messages by
// deadline, drop the expired, and pass each through the gate: admitted
// ones are dispatched, refused ones (and those the gate failed on) go back
// under their deadline. An error is the queue's; the round stops there.
func Poll(ctx context.Context, now time.Time, g Gate, batchSize int, q Queue) (Round, error) {
	r := Round{Budget: g.Budget(ctx)}
	r.Take = int(math.Floor(float64(batchSize) * r.Budget))
	for r.Popped < r.Take {
		m, err := q.Pop(ctx)
		if err != nil || m == nil {
			return r, err
		}
		r.Popped++
		if m.Expired(now) {
			r.Expired++
			q.Expire(ctx, m)
			continue
		}
		ok, release, err := g.Apply(ctx, m)
		if err != nil || !ok {
			if err != nil {
				r.GateErrors++
			} else {
				r.Refused++
			}
			if err := q.Requeue(ctx, m); err != nil {
				return r, err
			}
			continue
		}
		if release == nil {
			release = func() {}
		}
		if err := q.Dispatch(ctx, m, release); err != nil {
			release()
			return r, err
		}
		r.Dispatched++
	}
	return r, nil
}

// Backoff is the retry schedule: exponential from Base, at most Max and
// never past the deadline, with equal jitter. The zero Backoff is
// llm-d-async's: 2 s, 60 s.
type Backoff struct {
	Base, Max time.Duration
}

// llm-d-async's backoff.
const (
	RetryBaseDelay = 2 * time.Second
	RetryMaxDelay  = 60 * time.Second
)

// Delay is how long a message waits before its next attempt, the
// retries-th (1 for the first retry), toDeadline before its deadline;
// retryAfter is the server's Retry-After (0: none), honoured up to half of
// toDeadline. rnd draws from [0, 1). ok is false when less than a second
// is left (deadlines are whole seconds): the message gets its final result
// instead.
func (b Backoff) Delay(retries int, toDeadline, retryAfter time.Duration, rnd func() float64) (d time.Duration, ok bool) {
	base, maxD := b.Base, b.Max
	if base <= 0 {
		base = RetryBaseDelay
	}
	if maxD <= 0 {
		maxD = RetryMaxDelay
	}
	left := toDeadline.Truncate(time.Second)
	if left <= 0 {
		return 0, false
	}
	t := min(maxD, left, time.Duration(float64(base)*math.Pow(2, float64(retries))))
	f := t/2 + time.Duration(rnd()*float64(t/2))
	if retryAfter > f {
		f = max(f, time.Duration(float64(min(retryAfter, left/2))*(1+rnd()/4)))
	}
	return f, true
}
