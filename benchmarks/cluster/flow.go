package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/server"
)

// RevokedOutcome is RequestResult.Outcome of an in-flight request that
// flow control evicted.
const RevokedOutcome = "Revoked"

// simFlow drives the policy's real flow-control Controller on the virtual
// clock: arrivals enqueue, and after every event the simulation dispatches
// what the Controller lets through, each request routed (and so charged to
// the live load) before the next is asked for, as the picker's dispatcher
// does. TTL expiries and client cancellations are events of their own, so
// a request leaves the queue at the instant its deadline passes.
type simFlow struct {
	s   *sim
	c   *flowcontrol.Controller
	ttl time.Duration
	// cancels are the queued requests' client deadlines, earliest first.
	cancels []cancelAt
	// finished collects the items the Controller expired during a call.
	finished []*flowcontrol.Item
}

type cancelAt struct {
	at time.Time
	it *flowcontrol.Item
}

// queued is a request waiting in flow control.
type queued struct {
	i      int
	req    *server.Request
	sr     *scheduling.Request
	prompt []int
	cancel time.Time // zero: none
}

func newSimFlow(s *sim, cfg flowcontrol.Config, ds *endpoints.Datastore) (*simFlow, error) {
	f := &simFlow{s: s, ttl: cfg.RequestTTL}
	c, err := flowcontrol.New(cfg, flowcontrol.Options{Pool: ds, OnFinish: func(it *flowcontrol.Item) { f.finished = append(f.finished, it) }})
	if err != nil {
		return nil, err
	}
	f.c = c
	return f, nil
}

func (f *simFlow) enqueue(i int, req *server.Request, prompt []int, now time.Time) {
	sr, fr := f.s.dir.Classify(req)
	q := &queued{i: i, req: req, sr: sr, prompt: prompt}
	if t := f.s.reqs[i].Timeout; t > 0 {
		q.cancel = now.Add(t)
	}
	fr.Payload = q
	it, err := f.c.Enqueue(fr, now)
	if err != nil {
		f.refused(i, err, 0)
		return
	}
	if !q.cancel.IsZero() {
		at := cancelAt{q.cancel, it}
		k, _ := slices.BinarySearchFunc(f.cancels, at.at, func(c cancelAt, t time.Time) int { return c.at.Compare(t) })
		f.cancels = slices.Insert(f.cancels, k, at)
	}
}

// refused records a request flow control did not dispatch.
func (f *simFlow) refused(i int, err error, late time.Duration) {
	rr := &f.s.res.Requests[i]
	var fe *flowcontrol.Error
	if errors.As(err, &fe) {
		rr.Outcome = fe.Outcome.String()
	}
	rr.LeftLate = late
	f.s.fail(rr, fmt.Errorf("flow control: %w", err))
}

// cancel gives up the queued requests whose clients' deadlines are due.
func (f *simFlow) cancel(now time.Time) {
	if f == nil {
		return
	}
	for len(f.cancels) > 0 && !f.cancels[0].at.After(now) {
		c := f.cancels[0]
		f.cancels = f.cancels[1:]
		if f.c.Cancel(c.it, now) {
			f.collect(now)
		}
	}
}

// dispatch routes every request the Controller lets through now.
func (f *simFlow) dispatch(ctx context.Context, now time.Time) {
	if f == nil {
		return
	}
	for {
		it := f.c.Next(now)
		f.collect(now)
		if it == nil {
			return
		}
		q := it.Request().Payload.(*queued)
		f.s.res.Requests[q.i].Queued = now.Sub(it.EnqueueTime())
		dec, ex, err := f.s.dir.Dispatch(ctx, q.req, q.sr, it)
		f.s.begin(ctx, q.i, q.req, q.prompt, dec, ex, err, now)
	}
}

// collect records the items that left the queue without dispatch.
func (f *simFlow) collect(now time.Time) {
	for _, it := range f.finished {
		q := it.Request().Payload.(*queued)
		var late time.Duration
		switch it.Outcome() {
		case flowcontrol.EvictedTTL, flowcontrol.EvictedNoEndpoints:
			late = now.Sub(it.EnqueueTime().Add(f.ttl))
		case flowcontrol.EvictedContextCancelled:
			late = now.Sub(q.cancel)
		}
		f.refused(q.i, it.Err(), late)
	}
	clear(f.finished)
	f.finished = f.finished[:0]
}

// nextEvent is the next TTL expiry or client cancellation.
func (f *simFlow) nextEvent() (time.Time, bool) {
	if f == nil {
		return time.Time{}, false
	}
	t, ok := f.c.NextExpiry()
	if len(f.cancels) > 0 && (!ok || f.cancels[0].at.Before(t)) {
		t, ok = f.cancels[0].at, true
	}
	return t, ok
}

// Admit implements director.Admission; the simulation enqueues and
// dispatches itself and never calls it.
func (f *simFlow) Admit(context.Context, flowcontrol.Request, func(*flowcontrol.Item)) error {
	return errors.New("the simulation drives flow control itself")
}

// Notify implements director.Admission: the simulation dispatches after
// every event anyway.
func (f *simFlow) Notify() {}

// Track implements director.Admission: a revoked request is aborted on its
// server at once and its load released.
func (f *simFlow) Track(it *flowcontrol.Item, revoke func()) {
	id := it.Request().ID
	f.c.Track(it, f.s.clock.Now(), func() {
		revoke()
		f.s.evict(id)
	})
}

// Finished implements director.Admission.
func (f *simFlow) Finished(it *flowcontrol.Item) { f.c.Finished(it, f.s.clock.Now()) }

// evict ends an in-flight request flow control revoked.
func (s *sim) evict(id string) {
	lr := s.live[id]
	if lr == nil {
		return
	}
	delete(s.live, id)
	_ = lr.rep.eng.Abort(id)
	lr.ex.ResponseDone(context.Background(), server.ResponseSummary{Status: 200, Streaming: true, ServedEndpoint: lr.rep.addr})
	rr := &s.res.Requests[lr.idx]
	rr.Outcome = RevokedOutcome
	s.fail(rr, errors.New("evicted by flow control"))
}

// staticObjectives resolves the simulation's InferenceObjectives.
type staticObjectives map[string]int

func (o staticObjectives) Priority(name string) (int, bool) {
	p, ok := o[name]
	return p, ok
}

func objectives(m map[string]int) staticObjectives {
	if len(m) == 0 {
		return nil
	}
	return staticObjectives(m)
}
