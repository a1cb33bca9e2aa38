package agent

import (
	"container/list"
	"errors"
)

// errPoolFull: every slot is pinned.
var errPoolFull = errors.New("all slots are pinned")

// slotPool maps block hashes to the fixed-size slots of one memory area.
// Unpinned slots holding a block are reused least recently used first.
type slotPool struct {
	slotBytes int
	mem       []byte
	byHash    map[uint64]uint32
	meta      []slotMeta
	lru       list.List // of uint32: valid, unpinned slots, front = oldest
	free      []uint32
	onEvict   func(slot uint32, hash uint64)
}

type slotMeta struct {
	hash  uint64
	valid bool
	pins  int
	elem  *list.Element
}

func newSlotPool(mem []byte, slotBytes int) *slotPool {
	n := len(mem) / slotBytes
	p := &slotPool{slotBytes: slotBytes, mem: mem, byHash: make(map[uint64]uint32, n), meta: make([]slotMeta, n)}
	p.free = make([]uint32, n)
	for i := range p.free {
		p.free[i] = uint32(n - 1 - i)
	}
	return p
}

func (p *slotPool) slots() int { return len(p.meta) }

func (p *slotPool) bytes(s uint32) []byte {
	off := int(s) * p.slotBytes
	return p.mem[off : off+p.slotBytes : off+p.slotBytes]
}

// lookup finds hash's slot and marks it recently used.
func (p *slotPool) lookup(hash uint64) (uint32, bool) {
	s, ok := p.byHash[hash]
	if ok && p.meta[s].elem != nil {
		p.lru.MoveToBack(p.meta[s].elem)
	}
	return s, ok
}

// acquire returns hash's slot, taking a free or the oldest unpinned one
// when hash has none (fresh: its bytes must be written), and pins it.
func (p *slotPool) acquire(hash uint64) (slot uint32, fresh bool, err error) {
	if s, ok := p.byHash[hash]; ok {
		p.pin(s)
		return s, false, nil
	}
	switch {
	case len(p.free) > 0:
		slot = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
	case p.lru.Len() > 0:
		slot = p.lru.Front().Value.(uint32)
		old := p.meta[slot].hash
		p.lru.Remove(p.meta[slot].elem)
		p.meta[slot].elem = nil
		delete(p.byHash, old)
		if p.onEvict != nil {
			p.onEvict(slot, old)
		}
	default:
		return 0, false, errPoolFull
	}
	p.meta[slot] = slotMeta{hash: hash, valid: true, pins: 1}
	p.byHash[hash] = slot
	return slot, true, nil
}

func (p *slotPool) pin(s uint32) {
	m := &p.meta[s]
	if m.elem != nil {
		p.lru.Remove(m.elem)
		m.elem = nil
	}
	m.pins++
}

// unpin releases one pin; the last one makes a slot holding a block
// reusable (LRU) and a dropped slot free.
func (p *slotPool) unpin(s uint32) {
	m := &p.meta[s]
	if m.pins == 0 {
		return
	}
	m.pins--
	if m.pins > 0 {
		return
	}
	if m.valid {
		m.elem = p.lru.PushBack(s)
	} else {
		p.free = append(p.free, s)
	}
}

// drop forgets a slot's content (a failed transfer left it torn) and
// releases the caller's pin: no lookup finds the block any more, and the
// slot is free once every other holder (another request's hold on the same
// block) has unpinned it too, not before, or a new block could be written
// into a slot a hold still names.
func (p *slotPool) drop(s uint32) {
	m := &p.meta[s]
	if m.valid {
		delete(p.byHash, m.hash)
		m.valid = false
	}
	if m.elem != nil { // unpinned: nobody holds it
		p.lru.Remove(m.elem)
		m.elem = nil
		p.free = append(p.free, s)
		return
	}
	p.unpin(s)
}

// giveBack undoes acquires whose bytes will not be written: a slot taken
// fresh is dropped (it must not stay mapped to its hash), any other
// unpinned.
func (p *slotPool) giveBack(slots []uint32, fresh []bool) {
	for i, s := range slots {
		if fresh[i] {
			p.drop(s)
		} else {
			p.unpin(s)
		}
	}
}

// pinnedCount counts pinned slots (tests, stats).
func (p *slotPool) pinnedCount() int {
	n := 0
	for _, m := range p.meta {
		if m.pins > 0 {
			n++
		}
	}
	return n
}
