package endpoints

import (
	"sync/atomic"
	"time"
)

// The step clock. A continuously batching server emits every running
// stream's next token at the end of each engine step, so the response chunks
// the picker relays show where the server's steps end. A request routed in
// the middle of a decode step waits for that step to finish before its own
// prefill can start; for a short, mostly cached prompt that wait is as long
// as its whole computation, and it is not visible in any queue. The clock
// keeps the last step end seen and the typical step length, so that the
// latency model can price the rest of the step in progress.

// stepCoalesce is the gap below which two chunks belong to the same step:
// one step's tokens reach the picker over a few hundred microseconds.
const stepCoalesce = 500 * time.Microsecond

// maxStepGap bounds the gaps that count as a step's length: a longer quiet
// spell is the server idling or prefilling, not one decode step.
const maxStepGap = time.Second

// stepEMA is the weight of the newest step length in the average.
const stepEMA = 0.125

// stepClock is written by every response stream of the endpoint and read at
// decisions; each field is atomic and a torn pair only blurs one estimate.
type stepClock struct {
	last atomic.Int64 // unix nanoseconds of the last step end seen
	gap  atomic.Int64 // average step length, nanoseconds
}

// ObserveStep records a response chunk of a stream served by e at now.
func (e *Endpoint) ObserveStep(now time.Time) {
	c := &e.steps
	t := now.UnixNano()
	prev := c.last.Load()
	gap := time.Duration(t - prev)
	if prev != 0 && gap < stepCoalesce {
		return
	}
	if !c.last.CompareAndSwap(prev, t) {
		return // another stream recorded this step end
	}
	if prev == 0 || gap > maxStepGap {
		return
	}
	old := c.gap.Load()
	if old == 0 {
		c.gap.Store(int64(gap))
		return
	}
	c.gap.Store(old + int64(stepEMA*float64(int64(gap)-old)))
}

// StepRemaining estimates how much of the decode step in progress on e is
// left at now: the typical step length less the time since the last step
// ended, zero when no step end has been seen recently.
func (e *Endpoint) StepRemaining(now time.Time) time.Duration {
	last, gap := e.steps.last.Load(), e.steps.gap.Load()
	if last == 0 || gap == 0 {
		return 0
	}
	return max(0, time.Duration(gap-(now.UnixNano()-last)))
}
