package flowcontrol

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// RevocationTimeout is how long an eviction waits for the revoked
// request's load to be released before its reclaim credit is written off.
const RevocationTimeout = 5 * time.Second

// Options are a Controller's collaborators.
type Options struct {
	// Pool is where requests go; required.
	Pool Pool
	// Recorder receives metrics; nil records nothing.
	Recorder Recorder
	// OnFinish is called, with the Controller's lock held, for every item
	// that leaves the queue without being dispatched (rejected items are
	// returned by Enqueue instead). It must not call the Controller.
	OnFinish func(*Item)
}

// Controller holds queued requests and decides which one dispatches next.
// Its methods are safe for concurrent use; Next is meant to be called by
// one dispatcher at a time, each dispatched request charged to the live
// load model before the next call, so that the saturation it measures
// includes every request it let through.
type Controller struct {
	mu   sync.Mutex
	cfg  Config
	opts Options
	rec  Recorder
	now  time.Time

	bands      []*band // highest priority first
	byPriority map[int]*band
	queued     int64
	bytes      int64
	seq        uint64
	// head and tail list the queued items in enqueue order.
	head, tail *Item

	regimeKnown, poolEmpty bool
	closed                 bool

	// inflight are the dispatched sheddable requests eviction may revoke.
	inflight       []*Item
	pendingReclaim float64
	revoking       []*Item // revoked, awaiting release or timeout

	prios    []int
	ceilings []float64
	victims  []*Item
}

type band struct {
	c          *Controller
	priority   int
	cfg        BandConfig
	ordering   OrderingPolicy
	fairness   FairnessPolicy
	configured bool
	flows      map[string]*flow
	active     []*flow // flows holding requests, by fairness id
	queued     int64
	bytes      int64
	cursor     string
}

// New returns a Controller.
func New(cfg Config, opts Options) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Pool == nil {
		return nil, fmt.Errorf("flow control needs a pool")
	}
	c := &Controller{cfg: cfg, opts: opts, rec: opts.Recorder, byPriority: map[int]*band{}}
	if c.rec == nil {
		c.rec = nopRecorder{}
	}
	for _, bc := range cfg.Bands {
		c.addBand(bc, true)
	}
	return c, nil
}

func (c *Controller) addBand(bc BandConfig, configured bool) *band {
	b := &band{c: c, priority: bc.Priority, cfg: bc, ordering: bc.Ordering, fairness: bc.Fairness, configured: configured, flows: map[string]*flow{}}
	i, _ := slices.BinarySearchFunc(c.bands, b.priority, func(x *band, p int) int { return p - x.priority })
	c.bands = slices.Insert(c.bands, i, b)
	c.byPriority[b.priority] = b
	return b
}

// bandFor returns the band of priority p, provisioning one from the
// templates; nil when MaxBands are in use. Bands stay once provisioned:
// usage-limit policies rank the bands, and a rank must not move each time
// a band empties (priorities come from InferenceObjectives, a short list).
func (c *Controller) bandFor(p int) *band {
	if b, ok := c.byPriority[p]; ok {
		return b
	}
	if len(c.bands) >= MaxBands {
		return nil
	}
	t := c.cfg.DefaultBand
	if p < 0 {
		t = c.cfg.DefaultNegativeBand
	}
	t.Priority = p
	return c.addBand(t, false)
}

// Enqueue queues req at now. It returns an *Error when the request is
// refused: the controller is closed, or a global or band limit would be
// exceeded (RejectedCapacity, or RejectedNoEndpoints while the pool is
// empty).
func (c *Controller) Enqueue(req Request, now time.Time) (*Item, error) {
	return c.enqueue(req, now, nil, nil)
}

func (c *Controller) enqueue(req Request, now time.Time, done chan struct{}, dispatch func(*Item)) (*Item, error) {
	start := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	key := FlowKey{req.FairnessID, req.Priority}
	reject := func(o Outcome, msg string) (*Item, error) {
		e := &Error{Outcome: o, Msg: msg, ShuttingDown: c.closed, PoolEmpty: o == RejectedNoEndpoints}
		c.rec.Finished(&req, o, 0)
		c.rec.EnqueueDuration(key, o, time.Since(start))
		return nil, e
	}
	if c.closed {
		return reject(RejectedOther, ErrShuttingDown.Error())
	}
	b := c.bandFor(req.Priority)
	if b == nil {
		return reject(RejectedOther, fmt.Sprintf("more than %d priority bands", MaxBands))
	}
	bMaxBytes, bMaxReqs := b.cfg.limits()
	var over string
	switch {
	case c.cfg.MaxRequests > 0 && c.queued+1 > c.cfg.MaxRequests:
		over = "global maxRequests"
	case c.cfg.MaxBytes > 0 && c.bytes+req.Bytes > c.cfg.MaxBytes:
		over = "global maxBytes"
	case b.queued+1 > bMaxReqs:
		over = fmt.Sprintf("priority band %d maxRequests", b.priority)
	case b.bytes+req.Bytes > bMaxBytes:
		over = fmt.Sprintf("priority band %d maxBytes", b.priority)
	}
	if over != "" {
		if len(c.opts.Pool.Candidates()) == 0 {
			return reject(RejectedNoEndpoints, "queue full ("+over+") and the pool has no endpoints")
		}
		return reject(RejectedCapacity, "queue full: "+over)
	}
	c.seq++
	it := &Item{req: req, enqueued: now, budgetStart: now, seq: c.seq, index: -1, inflight: -1, done: done, dispatch: dispatch}
	if ttl := c.cfg.RequestTTL; ttl > 0 {
		it.ttlDeadline = now.Add(ttl)
	}
	f := b.flowFor(req.FairnessID)
	f.push(it)
	if !f.active {
		f.active = true
		i, _ := slices.BinarySearchFunc(b.active, f.key.FairnessID, func(x *flow, id string) int { return strings.Compare(x.key.FairnessID, id) })
		b.active = slices.Insert(b.active, i, f)
	}
	b.queued++
	b.bytes += req.Bytes
	c.queued++
	c.bytes += req.Bytes
	c.link(it)
	c.rec.Queued(&it.req, 1, req.Bytes)
	c.rec.EnqueueDuration(key, Dispatched, time.Since(start))
	return it, nil
}

func (b *band) flowFor(id string) *flow {
	if f, ok := b.flows[id]; ok {
		return f
	}
	if len(b.flows) >= MaxFlowsPerBand-1 {
		id = OtherFairnessID
		if f, ok := b.flows[id]; ok {
			return f
		}
	}
	f := &flow{key: FlowKey{id, b.priority}, band: b}
	b.flows[id] = f
	return f
}

func (c *Controller) link(it *Item) {
	it.prev = c.tail
	if c.tail != nil {
		c.tail.next = it
	} else {
		c.head = it
	}
	c.tail = it
}

func (c *Controller) unlink(it *Item) {
	if it.prev != nil {
		it.prev.next = it.next
	} else {
		c.head = it.next
	}
	if it.next != nil {
		it.next.prev = it.prev
	} else {
		c.tail = it.prev
	}
	it.prev, it.next = nil, nil
}

// take removes a queued item from its flow, band and the expiry list.
func (c *Controller) take(it *Item, o Outcome, now time.Time) {
	f := it.flow
	b := f.band
	f.remove(it)
	if f.Len() == 0 {
		f.active = false
		if i := slices.Index(b.active, f); i >= 0 {
			b.active = slices.Delete(b.active, i, i+1)
		}
		delete(b.flows, f.key.FairnessID)
	}
	b.queued--
	b.bytes -= it.req.Bytes
	c.queued--
	c.bytes -= it.req.Bytes
	c.unlink(it)
	it.outcome = o
	it.state = stateDispatched
	if o != Dispatched {
		it.state = stateFinished
		it.err = &Error{Outcome: o, PoolEmpty: c.poolEmpty, ShuttingDown: c.closed && o == EvictedOther}
	}
	c.rec.Queued(&it.req, -1, -it.req.Bytes)
	c.rec.Finished(&it.req, o, now.Sub(it.enqueued))
	if o != Dispatched && c.opts.OnFinish != nil {
		c.opts.OnFinish(it)
	}
}

// Cancel removes a queued item (its client went away) as
// EvictedContextCancelled. It reports false when the item had already left
// the queue.
func (c *Controller) Cancel(it *Item, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if it.state != stateQueued {
		return false
	}
	c.take(it, EvictedContextCancelled, now)
	return true
}

// Len is how many requests are queued.
func (c *Controller) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.queued)
}

// Next expires the items whose budget has run out and returns the item to
// dispatch now, or nil when nothing may dispatch (the queue is empty or
// saturation blocks it). The returned item has left the queue with outcome
// Dispatched.
func (c *Controller) Next(now time.Time) *Item {
	start := time.Now()
	c.mu.Lock()
	it, victims := c.next(now)
	c.mu.Unlock()
	for _, v := range victims {
		v.revoke()
	}
	c.rec.DispatchCycle(time.Since(start))
	return it
}

func (c *Controller) next(now time.Time) (*Item, []*Item) {
	c.now = now
	pool := c.opts.Pool.Candidates()
	c.regime(len(pool) == 0, now)
	c.expire(now)
	c.expireRevocations(now)
	// Measured on every call, the queue empty or not, so that the exported
	// saturation follows releases as well as dispatches (the async
	// processor's picker-saturation gate and autoscalers read it; measured
	// at dispatches alone it froze at the busiest moment).
	sat := c.measure(pool)
	// Likewise the queue's capacity gauges: measured only while requests
	// are queued, they kept the last non-empty queue's value.
	c.utilization()
	if c.queued == 0 {
		return nil, nil
	}
	c.prios = c.prios[:0]
	for _, b := range c.bands {
		c.prios = append(c.prios, b.priority)
	}
	c.ceilings = slices.Grow(c.ceilings[:0], len(c.bands))[:len(c.bands)]
	for i := range c.ceilings {
		c.ceilings[i] = 1
	}
	c.cfg.UsageLimit.Ceilings(sat, c.prios, c.ceilings)
	for i, b := range c.bands {
		if sat >= c.ceilings[i] {
			return nil, c.reclaim(pool, sat, i, now)
		}
		if b.queued == 0 {
			continue
		}
		f := b.fairness.Pick(Band{b})
		if f == nil || f.Len() == 0 {
			continue
		}
		it := f.Head()
		c.take(it, Dispatched, now)
		return it, nil
	}
	return nil, nil
}

// regime follows the pool between empty and not: each change starts a
// fresh TTL budget for every queued item.
func (c *Controller) regime(empty bool, now time.Time) {
	if c.regimeKnown && empty == c.poolEmpty {
		return
	}
	changed := c.regimeKnown
	c.regimeKnown, c.poolEmpty = true, empty
	if !changed {
		return
	}
	for it := c.head; it != nil; it = it.next {
		it.budgetStart = now
	}
}

// ttl is the budget in force and the bound on total wait (0: none).
func (c *Controller) ttl() (budget, bound time.Duration) {
	budget = c.cfg.RequestTTL
	if c.poolEmpty {
		budget = c.cfg.NoEndpointTTL
	}
	if c.cfg.RequestTTL > 0 && c.cfg.NoEndpointTTL > 0 {
		bound = max(c.cfg.RequestTTL, c.cfg.NoEndpointTTL)
	}
	return budget, bound
}

func (c *Controller) expire(now time.Time) {
	budget, bound := c.ttl()
	o := EvictedTTL
	if c.poolEmpty {
		o = EvictedNoEndpoints
	}
	for it := c.head; it != nil; it = c.head {
		byBudget := budget > 0 && !now.Before(it.budgetStart.Add(budget))
		byBound := bound > 0 && !now.Before(it.enqueued.Add(bound))
		if !byBudget && !byBound {
			return
		}
		c.take(it, o, now)
	}
}

// NextExpiry is the earliest time at which a queued item's budget or a
// revocation's wait runs out; ok is false when there is none.
func (c *Controller) NextExpiry() (t time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	take := func(x time.Time) {
		if !ok || x.Before(t) {
			t, ok = x, true
		}
	}
	if it := c.head; it != nil {
		budget, bound := c.ttl()
		if budget > 0 {
			take(it.budgetStart.Add(budget))
		}
		if bound > 0 {
			take(it.enqueued.Add(bound))
		}
	}
	for _, r := range c.revoking {
		take(r.revokedAt.Add(RevocationTimeout))
	}
	return t, ok
}

// measure is the pool's saturation per stage, the effective (gating) value
// being the larger. Servers labelled llm-d.ai/role prefill serve the
// prefill stage, decode (or unlabelled) the decode stage, both (or
// prefill-decode) both stages; encode-only and unknown roles serve neither.
func (c *Controller) measure(pool []*endpoints.Endpoint) float64 {
	var prefill, decode []*endpoints.Endpoint
	for _, e := range pool {
		switch e.Label(endpoints.RoleLabel) {
		case "prefill", "encode-prefill":
			prefill = append(prefill, e)
		case "decode", "":
			decode = append(decode, e)
		case "both", "prefill-decode", "encode-prefill-decode":
			prefill = append(prefill, e)
			decode = append(decode, e)
		}
	}
	sat := -1.0
	for _, st := range []struct {
		name string
		eps  []*endpoints.Endpoint
	}{{"prefill", prefill}, {"decode", decode}} {
		if len(st.eps) == 0 {
			c.rec.PoolSaturation(st.name, 0, false)
			continue
		}
		s := c.cfg.Detector.Saturation(st.eps)
		c.rec.PoolSaturation(st.name, s, true)
		sat = max(sat, s)
	}
	if sat < 0 {
		sat = c.cfg.Detector.Saturation(pool)
	}
	if sc, ok := c.cfg.Detector.(StaleCounter); ok {
		c.rec.StaleEndpoints(c.cfg.DetectorName, sc.StaleEndpoints(pool))
	}
	c.rec.PoolSaturation("effective", sat, true)
	return sat
}

func (c *Controller) utilization() {
	for _, b := range c.bands {
		mb, mr := b.cfg.limits()
		c.rec.BandUtilization(b.priority, float64(b.queued)/float64(mr), float64(b.bytes)/float64(mb))
	}
	if c.cfg.MaxRequests > 0 || c.cfg.MaxBytes > 0 {
		r, by := -1.0, -1.0
		if c.cfg.MaxRequests > 0 {
			r = float64(c.queued) / float64(c.cfg.MaxRequests)
		}
		if c.cfg.MaxBytes > 0 {
			by = float64(c.bytes) / float64(c.cfg.MaxBytes)
		}
		c.rec.GlobalUtilization(r, by)
	}
}

// Snapshot is a consistent view of the queue, for reports and tests.
type Snapshot struct {
	Queued int64
	Bytes  int64
	// Bands are the bands, highest priority first.
	Bands []BandSnapshot
	// InFlightSheddable are the dispatched sheddable requests eviction
	// tracks.
	InFlightSheddable int
}

// BandSnapshot is one band's share.
type BandSnapshot struct {
	Priority int
	Queued   int64
	Bytes    int64
	Flows    int
}

// Snapshot returns the queue's state.
func (c *Controller) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Snapshot{Queued: c.queued, Bytes: c.bytes, InFlightSheddable: len(c.inflight)}
	for _, b := range c.bands {
		s.Bands = append(s.Bands, BandSnapshot{Priority: b.priority, Queued: b.queued, Bytes: b.bytes, Flows: len(b.flows)})
	}
	return s
}

// Close refuses new requests from now on (RejectedOther, ShuttingDown);
// queued ones stay until dispatched, expired or evicted by EvictAll.
func (c *Controller) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// EvictAll evicts every queued request as EvictedOther (a controller
// shutting down).
func (c *Controller) EvictAll(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for it := c.head; it != nil; it = c.head {
		c.take(it, EvictedOther, now)
	}
}

// Track registers a dispatched sheddable request for eviction: revoke ends
// it (its response must then end, and Finished be called). Non-sheddable
// items, and every item when eviction is off, are not tracked.
func (c *Controller) Track(it *Item, now time.Time, revoke func()) {
	if !c.cfg.EnableEviction || !Sheddable(it.req.Priority) || revoke == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	it.dispatchedAt, it.revoke = now, revoke
	it.inflight = len(c.inflight)
	c.inflight = append(c.inflight, it)
}

// Finished reports that a dispatched request's response ended (its load
// released). A revoked request's end confirms the revocation.
func (c *Controller) Finished(it *Item, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if it.state == stateFinished {
		return
	}
	it.state = stateFinished
	if i := it.inflight; i >= 0 {
		last := len(c.inflight) - 1
		c.inflight[i] = c.inflight[last]
		c.inflight[i].inflight = i
		c.inflight[last] = nil
		c.inflight = c.inflight[:last]
		it.inflight = -1
	}
	if it.revoked {
		if i := slices.Index(c.revoking, it); i >= 0 {
			c.revoking = slices.Delete(c.revoking, i, i+1)
			c.pendingReclaim = max(0, c.pendingReclaim-it.credit)
			c.rec.Revocation("confirmed", now.Sub(it.revokedAt))
			c.rec.PendingReclaim(c.pendingReclaim)
		}
	}
}

func (c *Controller) expireRevocations(now time.Time) {
	kept := c.revoking[:0]
	for _, r := range c.revoking {
		if now.Sub(r.revokedAt) >= RevocationTimeout {
			c.pendingReclaim = max(0, c.pendingReclaim-r.credit)
			c.rec.Revocation("timed_out", now.Sub(r.revokedAt))
			continue
		}
		kept = append(kept, r)
	}
	clear(c.revoking[len(kept):])
	c.revoking = kept
	c.rec.PendingReclaim(c.pendingReclaim)
}

// reclaim sizes and picks the revocations for a cycle blocked at band
// index blocked: the demand is the highest blocked band holding requests;
// the victims are in-flight sheddable requests of lower priority, lowest
// priority first and, within a priority, the most recently dispatched (the
// least work lost). Enough are revoked to bring saturation under the
// demand's ceiling, counting revocations still pending.
func (c *Controller) reclaim(pool []*endpoints.Endpoint, sat float64, blocked int, now time.Time) []*Item {
	if !c.cfg.EnableEviction || len(c.inflight) == 0 {
		return nil
	}
	demand := -1
	for j := blocked; j < len(c.bands); j++ {
		if c.bands[j].queued > 0 {
			demand = j
			break
		}
	}
	if demand < 0 {
		return nil
	}
	target := sat - c.ceilings[demand]
	c.rec.ReclaimTarget(target)
	net := target - c.pendingReclaim
	if net < 0 || (net == 0 && c.pendingReclaim > 0) {
		return nil
	}
	credit := 0.0
	if rc, ok := c.cfg.Detector.(ReclaimCredit); ok {
		credit = rc.Credit(pool)
	}
	if !(credit > 0) {
		credit = 1 / float64(max(1, len(pool)))
	}
	n := max(1, int(math.Ceil(net/credit)))
	prio := c.bands[demand].priority
	c.victims = c.victims[:0]
	for _, it := range c.inflight {
		if !it.revoked && it.req.Priority < prio {
			c.victims = append(c.victims, it)
		}
	}
	slices.SortFunc(c.victims, func(a, b *Item) int {
		if a.req.Priority != b.req.Priority {
			return a.req.Priority - b.req.Priority
		}
		return b.dispatchedAt.Compare(a.dispatchedAt)
	})
	if len(c.victims) > n {
		clear(c.victims[n:])
		c.victims = c.victims[:n]
	}
	for _, v := range c.victims {
		v.revoked, v.credit, v.revokedAt = true, credit, now
		c.pendingReclaim += credit
		c.revoking = append(c.revoking, v)
		c.rec.Revoked(v.req.Priority)
	}
	c.rec.PendingReclaim(c.pendingReclaim)
	return slices.Clone(c.victims)
}
