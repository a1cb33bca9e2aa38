package endpoints

import (
	"sync/atomic"
	"time"
)

// The step clock. A continuously batching server emits every running
// stream's next token at the end of each engine step, so the chunks of the
// streamed responses the picker relays show where the server's steps end,
// and the gap between two chunks of one stream is one step. A request
// routed in the middle of a decode step waits for that step to finish
// before its own prefill can start; for a short, mostly cached prompt that
// wait is as long as its whole computation, and it is not visible in any
// queue. The clock keeps the last step end seen and the typical step
// length, so that the latency model can price the rest of the step in
// progress. It also counts the steps: every chunk relayed at one step end
// lands within a small part of a step of the others, so a chunk later than
// half its stream's last step after the last one seen begins the count's
// next step (half the typical step, for a stream's first chunk: a step
// short after long ones would otherwise go uncounted); a decoding
// stream's tokens so far are the steps since its first.

// maxStepGap bounds the inter-chunk gaps that count as a step's length: a
// longer one is a stalled stream, not one decode step.
const maxStepGap = time.Second

// The step clock keeps its gap in 32 bits.
const _ = int32(maxStepGap)

// stepEMA is the weight of the newest step length in the average.
const stepEMA = 0.125

// stepClock is written by every streamed response of the endpoint and read
// at decisions; each field is atomic and a torn pair only blurs one
// estimate.
type stepClock struct {
	last atomic.Int64 // unix nanoseconds of the last step end seen
	// gap is the average step length in nanoseconds (under maxStepGap:
	// 32 bits), count the step ends seen (modulo 2³²: its readers take
	// differences); the pair keeps Endpoint in its 256 bytes.
	gap   atomic.Int32
	count atomic.Uint32
}

// ObserveStep records a chunk of a streamed response served by e at now;
// itl is the time since the same stream's previous chunk (one step), zero
// for its first chunk.
func (e *Endpoint) ObserveStep(now time.Time, itl time.Duration) {
	c := &e.steps
	t := now.UnixNano()
	// A chunk more than half its stream's last step (a first chunk: half
	// the typical step) after the last one seen ends a new step; a lost
	// race recorded a later end, and counted it if it was new.
	sep := int64(itl)
	if sep <= 0 {
		sep = int64(c.gap.Load())
	}
	if prev := c.last.Load(); t > prev && c.last.CompareAndSwap(prev, t) && t-prev > sep/2 {
		c.count.Add(1)
	}
	if itl <= 0 || itl > maxStepGap {
		return
	}
	old := c.gap.Load()
	if old == 0 {
		c.gap.Store(int32(itl))
		return
	}
	c.gap.Store(old + int32(stepEMA*float64(int64(itl)-int64(old))))
}

// StepRemaining estimates how much of the decode step in progress on e is
// left at now: the typical step length less the time since the last step
// ended, zero when none is in progress by that measure. Only meaningful
// while e is decoding.
func (e *Endpoint) StepRemaining(now time.Time) time.Duration {
	last, gap := e.steps.last.Load(), int64(e.steps.gap.Load())
	if last == 0 || gap == 0 {
		return 0
	}
	return max(0, time.Duration(gap-(now.UnixNano()-last)))
}

// LastStep is the last step end seen on e (the zero time when none): the
// latency model's engine twin locks its clock onto it.
func (e *Endpoint) LastStep() time.Time {
	if t := e.steps.last.Load(); t != 0 {
		return time.Unix(0, t)
	}
	return time.Time{}
}

// Steps is the count of step ends seen on e, modulo 2³²: the latency
// model ages its decoding sequences by its differences.
func (e *Endpoint) Steps() uint32 { return e.steps.count.Load() }
