package flowcontrol

import "time"

type itemState uint8

const (
	stateQueued itemState = iota
	stateDispatched
	stateFinished
)

// Item is one request held by, or dispatched from, a Controller. Its fields
// belong to the Controller (under its lock); policies read them through the
// accessors while the Controller calls them.
type Item struct {
	req      Request
	enqueued time.Time
	seq      uint64
	// budgetStart is when the TTL budget in force began: the enqueue, or
	// the last change between an empty and a non-empty pool.
	budgetStart time.Time
	// ttlDeadline is enqueued + the TTL that applied at enqueue (for edf);
	// zero when none.
	ttlDeadline time.Time
	flow        *flow
	index       int // in flow.heap
	// prev and next link the Controller's queued items in enqueue order
	// (the expiry order: every item of one regime has the same budget).
	prev, next *Item
	state      itemState
	outcome    Outcome
	err        *Error

	// done is closed when the item leaves the queue (Gate only).
	done chan struct{}
	// dispatch is the Gate's work for this item, run by the dispatcher.
	dispatch func(*Item)

	// In flight (sheddable items, when eviction is on).
	dispatchedAt time.Time
	revoke       func()
	revoked      bool
	revokedAt    time.Time
	credit       float64
	inflight     int // index in Controller.inflight, -1 when absent
}

// Request is the request the item holds.
func (it *Item) Request() *Request { return &it.req }

// Key is the item's flow.
func (it *Item) Key() FlowKey { return FlowKey{it.req.FairnessID, it.req.Priority} }

// EnqueueTime is when the Controller queued it.
func (it *Item) EnqueueTime() time.Time { return it.enqueued }

// Seq orders items by arrival at the Controller: the FCFS tie-break.
func (it *Item) Seq() uint64 { return it.seq }

// Deadline is the sooner of the queue's TTL deadline and the client's own;
// ok is false when there is neither.
func (it *Item) Deadline() (time.Time, bool) {
	d, c := it.ttlDeadline, it.req.Deadline
	switch {
	case d.IsZero() && c.IsZero():
		return time.Time{}, false
	case d.IsZero():
		return c, true
	case c.IsZero() || d.Before(c):
		return d, true
	default:
		return c, true
	}
}

// Outcome is the item's final outcome once it left the queue.
func (it *Item) Outcome() Outcome { return it.outcome }

// Err is why the item was not dispatched; nil when it was (or is queued).
func (it *Item) Err() error {
	if it.err == nil {
		return nil
	}
	return it.err
}

// flow is one (fairness id, priority) queue: a binary heap by the band's
// ordering policy, so that removing a cancelled item is O(log n).
type flow struct {
	key    FlowKey
	band   *band
	heap   []*Item
	bytes  int64
	active bool // listed in band.active
}

// Flow is a flow as a fairness policy sees it.
type Flow = flow

// FairnessID is the flow's fairness id.
func (f *flow) FairnessID() string { return f.key.FairnessID }

// Len is how many requests it holds.
func (f *flow) Len() int { return len(f.heap) }

// Head is the request its ordering policy dispatches next; nil when empty.
func (f *flow) Head() *Item {
	if len(f.heap) == 0 {
		return nil
	}
	return f.heap[0]
}

func (f *flow) less(i, j int) bool { return f.band.ordering.Less(f.heap[i], f.heap[j]) }

func (f *flow) swap(i, j int) {
	f.heap[i], f.heap[j] = f.heap[j], f.heap[i]
	f.heap[i].index = i
	f.heap[j].index = j
}

func (f *flow) push(it *Item) {
	it.flow = f
	it.index = len(f.heap)
	f.heap = append(f.heap, it)
	f.bytes += it.req.Bytes
	f.up(it.index)
}

// remove takes it out of the heap.
func (f *flow) remove(it *Item) {
	i := it.index
	last := len(f.heap) - 1
	if i != last {
		f.swap(i, last)
	}
	f.heap[last] = nil
	f.heap = f.heap[:last]
	if i != last {
		if !f.down(i) {
			f.up(i)
		}
	}
	f.bytes -= it.req.Bytes
	it.index = -1
	it.flow = nil
	// A drained burst must not pin its backing array.
	if len(f.heap) == 0 && cap(f.heap) > 64 {
		f.heap = nil
	}
}

func (f *flow) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !f.less(j, i) {
			return
		}
		f.swap(i, j)
		j = i
	}
}

func (f *flow) down(i0 int) bool {
	i, n := i0, len(f.heap)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && f.less(r, l) {
			j = r
		}
		if !f.less(j, i) {
			break
		}
		f.swap(i, j)
		i = j
	}
	return i > i0
}
