package agent

import (
	"container/heap"
	"time"
)

// leaseHeap orders the leases by deadline, earliest first (container/heap;
// lease.at is each one's index). The agent's expiry timer is armed for the
// head, so no lease is looked at before it is due: an idle agent sleeps
// until the earliest deadline, and a lease expires at its deadline.
type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }

func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}

func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.at = len(*h)
	*h = append(*h, l)
}

func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return l
}

// addLeaseLocked records a new lease; one due before every other re-arms
// the expiry timer.
func (a *Agent) addLeaseLocked(l *lease) {
	a.leases[l.id] = l
	heap.Push(&a.deadlines, l)
	if l.at == 0 {
		a.expiry.Reset(time.Until(l.deadline))
	}
}

// removeLeaseLocked forgets a released or expired lease. The timer is left
// armed for it when it was the head: it then finds nothing due and re-arms
// for the new head, which is cheaper than re-arming on every release.
func (a *Agent) removeLeaseLocked(l *lease) {
	delete(a.leases, l.id)
	heap.Remove(&a.deadlines, l.at)
}

// expire runs on the expiry timer: it frees the leases that are due and
// arms the timer for the next deadline, if any lease is left.
func (a *Agent) expire() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ctx.Err() != nil {
		return // closed (Close stopped the timer, but this run had started)
	}
	now := time.Now()
	for len(a.deadlines) > 0 && !a.deadlines[0].deadline.After(now) {
		a.releaseLocked(a.deadlines[0], true)
	}
	if len(a.deadlines) > 0 {
		a.expiry.Reset(a.deadlines[0].deadline.Sub(now))
	}
}
