package engine

import (
	"sync"
	"time"
)

// Clock is the engine's only source of time: arrival stamps, P/D transfer
// completion and held-block timeouts.
type Clock interface {
	Now() time.Time
}

// VirtualClock is a clock that moves only when told to, for discrete-event
// simulation. It is safe for concurrent use.
type VirtualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewVirtualClock starts a virtual clock at start.
func NewVirtualClock(start time.Time) *VirtualClock { return &VirtualClock{now: start} }

// Now returns the current virtual time.
func (c *VirtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d; negative d is ignored because time
// in a simulation must not run backwards.
func (c *VirtualClock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t if t is later than now.
func (c *VirtualClock) Set(t time.Time) {
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	c.mu.Unlock()
}

// scaledClock runs model time Scale times faster than wall time, so that a
// simulator can be exercised faster than real hardware would allow.
type scaledClock struct {
	start time.Time
	scale float64
}

func (c scaledClock) Now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.start)) * c.scale))
}

// wall converts a model duration into the wall time to wait for it.
func (c scaledClock) wall(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.scale)
}
