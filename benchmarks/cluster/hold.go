package cluster

import (
	"context"
	"slices"
	"time"

	"github.com/kvgate/kvgate/extproc/server"
)

// holdReachDelay is how long a request the picker lets go after a hold
// takes to reach its server: the first token that releases it has been
// streamed to the picker, and the request then crosses the proxy. The
// server starts its next step at that first token without it, as a real
// one does.
const holdReachDelay = 2 * time.Millisecond

// heldReq is a routed request a Holder keeps in the picker (see
// scheduling.Holder), or one on its way to its server after release.
type heldReq struct {
	i        int
	req      *server.Request
	prompt   []int
	dec      *server.Decision
	ex       server.Exchange
	release  <-chan struct{}
	deadline time.Time // the hold's bound
	due      time.Time // when it reaches its server (once released)
}

// holds keeps the held requests of the simulation, in routing order, and
// those released, by arrival at their servers.
type holds struct {
	held, due []heldReq
}

// holder is the director's exchange as a driver under
// director.Options.DriverHolds sees it.
type holder interface {
	Hold() (<-chan struct{}, time.Duration)
}

// hold keeps a routed request if a Holder holds it; false when it may go
// now.
func (h *holds) hold(i int, req *server.Request, prompt []int, dec *server.Decision, ex server.Exchange, now time.Time) bool {
	x, ok := ex.(holder)
	if !ok {
		return false
	}
	release, most := x.Hold()
	if release == nil {
		return false
	}
	h.held = append(h.held, heldReq{i: i, req: req, prompt: prompt, dec: dec, ex: ex, release: release, deadline: now.Add(most)})
	return true
}

// releaseDue moves the requests released by now (or past their bound)
// on their way to their servers.
func (h *holds) releaseDue(now time.Time) {
	h.held = slices.DeleteFunc(h.held, func(r heldReq) bool {
		select {
		case <-r.release:
		default:
			if now.Before(r.deadline) {
				return false
			}
		}
		r.due = now.Add(holdReachDelay)
		h.due = append(h.due, r) // released in time order: due stays sorted
		return true
	})
}

// nextEvent is the next arrival of a released request or hold bound.
func (h *holds) nextEvent(take func(time.Time)) {
	if len(h.due) > 0 {
		take(h.due[0].due)
	}
	for _, r := range h.held {
		take(r.deadline)
	}
}

// arriveHeld hands the released requests that reach their servers by now to
// them.
func (s *sim) arriveHeld(ctx context.Context, now time.Time) {
	h := &s.holds
	for len(h.due) > 0 && !h.due[0].due.After(now) {
		r := h.due[0]
		h.due = h.due[1:]
		s.handOver(ctx, r.i, r.req, r.prompt, r.dec, r.ex, now)
	}
}
