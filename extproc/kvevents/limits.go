package kvevents

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Why a budget refused bytes.
var (
	errPublisherBudget = errors.New("the publisher's share of the intake memory budget is used up")
	errGlobalBudget    = errors.New("the intake memory budget is used up")
)

// budget counts the bytes of messages read but not yet applied, over all
// connections, beyond each connection's floor.
type budget struct {
	max  int64
	used atomic.Int64
}

// floorBytes is what every connection may hold whatever the others hold,
// so that a flood from some peers cannot refuse every other publisher's
// next batch: the intake holds at most MemoryBudget + MaxConns×floorBytes.
const floorBytes = 128 << 10

// connBudget is one connection's share of a budget; it implements
// zmtp.Allocator. Bytes reserved by the connection's reader are released
// by the worker that applies (or drops) the message.
type connBudget struct {
	g   *budget
	max int64

	mu      sync.Mutex
	used    int64 // held by this connection
	charged int64 // of which counted in g: what exceeds floorBytes
}

func (a *connBudget) Reserve(n int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used+int64(n) > a.max {
		return errPublisherBudget
	}
	if extra := max(0, a.used+int64(n)-floorBytes) - a.charged; extra > 0 {
		if a.g.used.Add(extra) > a.g.max {
			a.g.used.Add(-extra)
			return errGlobalBudget
		}
		a.charged += extra
	}
	a.used += int64(n)
	return nil
}

func (a *connBudget) Release(n int) {
	if a == nil || n == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used -= int64(n)
	if want := max(0, a.used-floorBytes); a.charged > want {
		a.g.used.Add(want - a.charged)
		a.charged = want
	}
}

// bucket is a token bucket on messages and bytes per second; take waits
// for tokens, so a publisher over its rate is slowed (TCP pushes back to
// its own send queue) rather than allowed to fill the picker's queues.
type bucket struct {
	msgRate, byteRate   float64 // per second; 0 for no limit
	msgBurst, byteBurst float64

	mu          sync.Mutex
	msgs, bytes float64
	at          time.Time
}

func newBucket(msgRate, byteRate float64, byteBurst int64) *bucket {
	b := &bucket{msgRate: msgRate, byteRate: byteRate, msgBurst: max(msgRate, 1), byteBurst: float64(byteBurst), at: time.Now()}
	b.msgs, b.bytes = b.msgBurst, b.byteBurst
	return b
}

// take charges one message of n bytes, first waiting until the bucket
// holds enough (a message larger than the burst waits for a full bucket
// and drives it negative). It fails only when ctx ends.
func (b *bucket) take(ctx context.Context, n int) error {
	if b.msgRate <= 0 && b.byteRate <= 0 {
		return nil
	}
	b.mu.Lock()
	now := time.Now()
	el := now.Sub(b.at).Seconds()
	b.at = now
	var wait float64
	if b.msgRate > 0 {
		b.msgs = min(b.msgBurst, b.msgs+el*b.msgRate)
		if b.msgs < 1 {
			wait = (1 - b.msgs) / b.msgRate
		}
		b.msgs--
	}
	if b.byteRate > 0 {
		b.bytes = min(b.byteBurst, b.bytes+el*b.byteRate)
		need := min(float64(n), b.byteBurst)
		if b.bytes < need {
			wait = max(wait, (need-b.bytes)/b.byteRate)
		}
		b.bytes -= float64(n)
	}
	b.mu.Unlock()
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(wait * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
