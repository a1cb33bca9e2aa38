package seriescache

import (
	"sync"
	"sync/atomic"
	"testing"
)

// A label set resolves once, however many goroutines ask for it at once;
// the cache never holds more than its bound, and an evicted or deleted set
// resolves again.
func TestCache(t *testing.T) {
	var resolved atomic.Int64
	c := New(4, func(k int) *int {
		resolved.Add(1)
		v := k * 10
		return &v
	})
	var wg sync.WaitGroup
	got := make([]*int, 8)
	for i := range got {
		wg.Go(func() { got[i] = c.Get(1) })
	}
	wg.Wait()
	for _, p := range got {
		if p != got[0] || *p != 10 {
			t.Fatalf("Get(1) = %p (%d), want one value, 10", p, *p)
		}
	}
	if n := resolved.Load(); n != 1 {
		t.Fatalf("resolved %d times, want once", n)
	}
	for k := range 100 {
		if v := c.Get(k); *v != k*10 {
			t.Fatalf("Get(%d) = %d", k, *v)
		}
		if n := c.Len(); n > 4 {
			t.Fatalf("%d entries, bound 4", n)
		}
	}
	last := c.Get(99)
	c.Delete(99)
	if c.Get(99) == last {
		t.Error("a deleted label set kept its value")
	}
	if New(0, func(int) *int { return new(int) }).Get(1) == nil {
		t.Error("a cache bounded at 0 (taken as 1) returned nil")
	}
}
