package bytebudget

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

// ErrExhausted is returned by Reserve when the budget has no room left.
var ErrExhausted = errors.New("request body memory budget exhausted")

// Budget counts reserved bytes against a limit. The zero value and nil are
// unlimited. Safe for concurrent use.
type Budget struct {
	limit int64
	used  atomic.Int64
	peak  atomic.Int64
}

// New returns a budget of limit bytes; limit <= 0 means unlimited.
func New(limit int64) *Budget { return &Budget{limit: limit} }

// Reserve takes n bytes, or none and an error wrapping ErrExhausted.
func (b *Budget) Reserve(n int64) error {
	if b == nil || n <= 0 {
		return nil
	}
	for {
		used := b.used.Load()
		if b.limit > 0 && used+n > b.limit {
			return fmt.Errorf("%w: %d of %d bytes held, %d more asked", ErrExhausted, used, b.limit, n)
		}
		if b.used.CompareAndSwap(used, used+n) {
			b.notePeak(used + n)
			return nil
		}
	}
}

func (b *Budget) notePeak(used int64) {
	for {
		p := b.peak.Load()
		if used <= p || b.peak.CompareAndSwap(p, used) {
			return
		}
	}
}

// Release returns n reserved bytes.
func (b *Budget) Release(n int64) {
	if b == nil || n <= 0 {
		return
	}
	b.used.Add(-n)
}

// Used is the bytes reserved now.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Peak is the most bytes ever reserved at once.
func (b *Budget) Peak() int64 {
	if b == nil {
		return 0
	}
	return b.peak.Load()
}

// Limit is the budget's size; 0 is unlimited.
func (b *Budget) Limit() int64 {
	if b == nil || b.limit < 0 {
		return 0
	}
	return b.limit
}

// Holder is one owner's share of a budget: what it reserved, released in
// one call when it is done. It belongs to one goroutine.
type Holder struct {
	b    *Budget
	held int64
}

// Hold returns a holder drawing on b.
func (b *Budget) Hold() Holder { return Holder{b: b} }

// Grow makes the holder's share at least n bytes.
func (h *Holder) Grow(n int64) error {
	if n <= h.held {
		return nil
	}
	if err := h.b.Reserve(n - h.held); err != nil {
		return err
	}
	h.held = n
	return nil
}

// Held is the holder's current share.
func (h *Holder) Held() int64 { return h.held }

// Done releases the holder's share; it may be called more than once.
func (h *Holder) Done() {
	h.b.Release(h.held)
	h.held = 0
}

// Append appends p to buf, growing buf as append would (doubling, but to
// at most limit bytes) with the larger buffer's bytes reserved from h
// before it is allocated; on an error wrapping ErrExhausted buf is
// returned unchanged. The caller keeps len(buf)+len(p) within limit.
func (h *Holder) Append(buf, p []byte, limit int) ([]byte, error) {
	if n := len(buf) + len(p); n > cap(buf) {
		c := min(max(n, 2*cap(buf)), limit)
		if err := h.Grow(int64(c)); err != nil {
			return buf, err
		}
		buf = append(make([]byte, 0, c), buf...)
	}
	return append(buf, p...), nil
}

// ReadUpTo reads r until EOF or until it has limit bytes; eof tells which.
// The buffer grows in steps, each reserved from h's budget before it is
// allocated, so a body's memory is counted before it exists; an
// exhausted budget fails with an error wrapping ErrExhausted.
func ReadUpTo(r io.Reader, limit int, h *Holder) (b []byte, eof bool, err error) {
	const first = 64 << 10
	for {
		if len(b) == cap(b) {
			if len(b) >= limit {
				return b, false, nil
			}
			c := min(max(first, 2*cap(b)), limit)
			if err := h.Grow(int64(c)); err != nil {
				return nil, false, err
			}
			b = append(make([]byte, 0, c), b...)
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			return b, true, nil
		}
		if err != nil {
			return nil, false, err
		}
	}
}
