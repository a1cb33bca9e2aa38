package flowcontrol

import (
	"context"
	"time"
)

// Tick is how often a Gate re-measures the pool while requests are queued:
// releases of live load wake it at once, but a scrape (which moves the
// utilization detector) or a metric going stale does not.
const Tick = 5 * time.Millisecond

// Gate is the blocking front end of a Controller for the picker: Admit
// holds a request's goroutine until the dispatcher goroutine (Run) has run
// its dispatch, or until it is rejected, expired, cancelled or evicted at
// shutdown.
type Gate struct {
	c    *Controller
	now  func() time.Time
	wake chan struct{}
}

// NewGate returns a Gate over a new Controller; opts.OnFinish must be nil
// (the Gate owns it). now defaults to time.Now.
func NewGate(cfg Config, opts Options, now func() time.Time) (*Gate, error) {
	if now == nil {
		now = time.Now
	}
	g := &Gate{now: now, wake: make(chan struct{}, 1)}
	opts.OnFinish = func(it *Item) { close(it.done) }
	c, err := New(cfg, opts)
	if err != nil {
		return nil, err
	}
	g.c = c
	return g, nil
}

// Controller is the Gate's Controller.
func (g *Gate) Controller() *Controller { return g.c }

// Admit queues req and waits. dispatch runs on the dispatcher goroutine
// when the request's turn comes (it must route the request and charge its
// load before returning, so that the next dispatch sees it); Admit then
// returns nil. Otherwise Admit returns the *Error of the request's outcome.
// A cancelled ctx removes a queued request at once.
func (g *Gate) Admit(ctx context.Context, req Request, dispatch func(*Item)) error {
	done := make(chan struct{})
	it, err := g.c.enqueue(req, g.now(), done, dispatch)
	if err != nil {
		return err
	}
	g.Notify()
	select {
	case <-done:
	case <-ctx.Done():
		if g.c.Cancel(it, g.now()) {
			return it.err
		}
		// Already dispatching (or just finished): wait for it.
		<-done
	}
	if it.outcome == Dispatched {
		return nil
	}
	return it.err
}

// Notify wakes the dispatcher: capacity may have freed, or a request
// arrived. It never blocks.
func (g *Gate) Notify() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Run dispatches until ctx ends.
func (g *Gate) Run(ctx context.Context) error {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		for {
			it := g.c.Next(g.now())
			if it == nil {
				break
			}
			it.dispatch(it)
			close(it.done)
		}
		wait := time.Duration(-1)
		if g.c.Len() > 0 {
			wait = Tick
		}
		if at, ok := g.c.NextExpiry(); ok {
			if d := max(0, at.Sub(g.now())); wait < 0 || d < wait {
				wait = d
			}
		}
		var timeout <-chan time.Time
		if wait >= 0 {
			t.Reset(wait)
			timeout = t.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-g.wake:
		case <-timeout:
		}
		if !t.Stop() && timeout != nil {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

// Shutdown stops admitting and rejects what is queued, new and queued
// requests alike refused as shutting down (503 rejected-shutting-down), as
// llm-d's flow controller does. It does not wait for the queue: on a
// saturated pool, waiting for queued requests to dispatch would spend the
// drain that the requests already routed need to finish their responses.
// A request the dispatcher is dispatching meanwhile is routed as usual.
func (g *Gate) Shutdown() {
	g.c.Close()
	g.c.EvictAll(g.now())
}

// Track registers a dispatched request for eviction (see Controller.Track).
func (g *Gate) Track(it *Item, revoke func()) { g.c.Track(it, g.now(), revoke) }

// Finished reports a dispatched request's end and wakes the dispatcher:
// its load was released.
func (g *Gate) Finished(it *Item) {
	g.c.Finished(it, g.now())
	g.Notify()
}
