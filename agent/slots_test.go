package agent

import (
	"slices"
	"testing"
)

// TestSlotPoolDrop: dropping a slot forgets its block at once but frees
// the slot only when its last holder lets go, so a hold that still names
// it never sees another block written there.
func TestSlotPoolDrop(t *testing.T) {
	acquire := func(t *testing.T, p *slotPool, h uint64, wantFresh bool) uint32 {
		t.Helper()
		s, fresh, err := p.acquire(h)
		if err != nil || fresh != wantFresh {
			t.Fatalf("acquire(%d): slot %d fresh %v err %v, want fresh %v", h, s, fresh, err, wantFresh)
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		holders int // pins on the dropped slot besides the dropper's
		drops   int // holders that drop instead of unpinning
	}{
		{"sole holder", 0, 0},
		{"another hold pins it", 1, 0},
		{"two other holds", 2, 0},
		{"every holder drops", 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newSlotPool(make([]byte, 2*8), 8)
			s := acquire(t, p, 1, true)
			for range tc.holders {
				if got := acquire(t, p, 1, false); got != s {
					t.Fatalf("second acquire of hash 1: slot %d, want %d", got, s)
				}
			}
			p.drop(s)
			if _, ok := p.lookup(1); ok {
				t.Fatal("a dropped block is still found")
			}
			other := acquire(t, p, 2, true)
			if tc.holders > 0 {
				if other == s {
					t.Fatalf("slot %d reused while %d holds pin it", s, tc.holders)
				}
				if _, _, err := p.acquire(3); err != errPoolFull {
					t.Fatalf("third block: %v, want the pool full (slot %d still held)", err, s)
				}
			}
			for i := range tc.holders {
				if i < tc.drops {
					p.drop(s)
				} else {
					p.unpin(s)
				}
			}
			p.unpin(other)
			if n := p.pinnedCount(); n != 0 {
				t.Fatalf("%d slots still pinned", n)
			}
			// Every slot is reusable exactly once: no slot is free twice.
			var got []uint32
			for h := uint64(10); h < 12; h++ {
				got = append(got, acquire(t, p, h, true))
			}
			slices.Sort(got)
			if !slices.Equal(got, []uint32{0, 1}) {
				t.Fatalf("slots after release %v, want [0 1]", got)
			}
			if _, _, err := p.acquire(12); err != errPoolFull {
				t.Fatalf("a third block fits in two slots: %v", err)
			}
		})
	}
}

// TestSlotPoolDropUnpinned: a slot dropped while nobody pins it is free at
// once and leaves the LRU list.
func TestSlotPoolDropUnpinned(t *testing.T) {
	p := newSlotPool(make([]byte, 2*8), 8)
	s, _, _ := p.acquire(1)
	p.unpin(s)
	p.drop(s)
	if p.lru.Len() != 0 || len(p.free) != 2 {
		t.Fatalf("lru %d, free %v", p.lru.Len(), p.free)
	}
	p.drop(s) // already free: nothing changes
	if len(p.free) != 2 {
		t.Fatalf("free %v after a second drop", p.free)
	}
}
