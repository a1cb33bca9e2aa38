package kvindex

import (
	"math"
	"sync"
)

// An entry is one (block, endpoint) pair packed in 16 bits: the endpoint id
// in the low bits and the tiers the endpoint holds the block in on top.
const (
	idBits     = 14
	idMask     = 1<<idBits - 1
	tierGPUBit = 1 << idBits
	tierCPUBit = 2 << idBits
	tierMask   = tierGPUBit | tierCPUBit
)

// A block's meta word: its entry count and the CLOCK reference bit.
const (
	countMask = idMask + 1 | idMask // up to MaxEndpoints+1 entries
	refBit    = 1 << 15
)

// inlineEntries is how many entries fit in a block record before the rest
// spill into the shard's spill map; 3 makes the record 16 bytes.
const inlineEntries = 3

// minSlots is a new shard's table size (a power of two).
const minSlots = 1 << 10

// block is one cached block and the endpoints holding it. Records live in
// the hash table itself, so finding a block's endpoints costs one cache
// line, and hold no pointers, so the garbage collector never scans them.
type block struct {
	hash   uint64
	meta   uint16 // entry count (0: empty slot) and reference bit
	inline [inlineEntries]uint16
}

// blockBytes is the size of a slot, for the byte estimate.
const blockBytes = 16

func (b *block) n() int { return int(b.meta & countMask) }

// shard is one hash partition of the index. mu guards every field: readers
// take it shared, writers exclusively.
type shard struct {
	mu sync.RWMutex

	// slots is an open-addressing (linear probing) table of block records,
	// at most three quarters full.
	slots []block
	used  int // live blocks

	// spill holds, by block hash, the entries past inlineEntries of blocks
	// that many endpoints share (typically the system prompt's blocks).
	spill map[uint64][]uint16

	// copies counts the copies past the first of a block that one
	// endpoint stored in one tier. vLLM's block pool may hold two blocks
	// with one hash (two requests computed it at once) and announces each
	// with a BlockStored and each eviction with a BlockRemoved, so the
	// endpoint holds the block until its last copy goes. Copies are rare
	// and short-lived, hence a map beside the records rather than a count
	// in each, bounded to maxCopies keys: past it a further copy is not
	// counted and its block goes at its first removal, as errs towards
	// forgetting, so that a publisher storing every block twice cannot
	// grow the index past what its entry bound allows for.
	copies    map[copyKey]uint32
	maxCopies int

	// hand is the CLOCK eviction cursor over slots: a block stored since
	// the hand last passed has its reference bit set and is spared once.
	hand       int
	entries    int
	maxEntries int
	evictions  uint64

	_ [64]byte // keep neighbouring shards' locks off this cache line
}

// copyKey is a block and one entry with a single tier bit.
type copyKey struct {
	hash  uint64
	entry uint16
}

// copyBytes estimates one key of a shard's copies map.
const copyBytes = 32

// copiesPerEntries: a shard counts copies for at most 1/copiesPerEntries
// of its entries bound, far above the few blocks vLLM holds twice at once.
const copiesPerEntries = 16

func newShard(maxEntries int) *shard {
	return &shard{
		slots:      make([]block, minSlots),
		spill:      make(map[uint64][]uint16),
		copies:     make(map[copyKey]uint32),
		maxCopies:  max(1, maxEntries/copiesPerEntries),
		maxEntries: maxEntries,
	}
}

// find returns the slot of hash h (m = mix64(h)), or -1.
func (s *shard) find(h, m uint64) int {
	mask := len(s.slots) - 1
	for i := int(m) & mask; ; i = (i + 1) & mask {
		b := &s.slots[i]
		if b.meta&countMask == 0 {
			return -1
		}
		if b.hash == h {
			return i
		}
	}
}

// insert places a new record for h (which must be absent) and returns its
// slot, growing the table first when it is three quarters full.
func (s *shard) insert(h, m uint64) int {
	if (s.used+1)*4 > len(s.slots)*3 {
		s.grow()
	}
	mask := len(s.slots) - 1
	i := int(m) & mask
	for s.slots[i].meta&countMask != 0 {
		i = (i + 1) & mask
	}
	s.slots[i] = block{hash: h, meta: refBit}
	s.used++
	return i
}

// grow doubles the table. It copies the whole shard under the write lock:
// at 10 million entries over 64 shards that is a few milliseconds, once per
// doubling.
func (s *shard) grow() {
	old := s.slots
	s.slots = make([]block, 2*len(old))
	mask := len(s.slots) - 1
	for _, b := range old {
		if b.meta&countMask == 0 {
			continue
		}
		i := int(mix64(b.hash)) & mask
		for s.slots[i].meta&countMask != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = b
	}
	s.hand = 0
}

// free empties slot i with backward-shift deletion, so linear probing needs
// no tombstones: later records of the probe run move back into the hole.
func (s *shard) free(i int) {
	b := &s.slots[i]
	if len(s.copies) > 0 {
		for k := range b.n() {
			s.forgetCopies(b.hash, s.entryAt(b, k))
		}
	}
	s.entries -= b.n()
	if b.n() > inlineEntries {
		delete(s.spill, b.hash)
	}
	mask := len(s.slots) - 1
	for j := i; ; {
		j = (j + 1) & mask
		nb := &s.slots[j]
		if nb.meta&countMask == 0 {
			break
		}
		home := int(mix64(nb.hash)) & mask
		// The record at j may move back to i only if its home slot is not
		// cyclically within (i, j].
		if (i <= j && i < home && home <= j) || (i > j && (i < home || home <= j)) {
			continue
		}
		s.slots[i] = *nb
		i = j
	}
	s.slots[i] = block{}
	s.used--
}

// entriesAt are slot k's entries: inline, then spilled.
func (s *shard) entriesAt(k int) (inline, spill []uint16) {
	b := &s.slots[k]
	n := b.n()
	if n > inlineEntries {
		return b.inline[:], s.spill[b.hash]
	}
	return b.inline[:n], nil
}

// holdsAny reports whether a candidate of c holds block h (m = mix64(h)).
func (s *shard) holdsAny(h, m uint64, c *Candidates) bool {
	k := s.find(h, m)
	if k < 0 {
		return false
	}
	b := &s.slots[k]
	n := b.n()
	for e := range min(n, inlineEntries) {
		if c.at(b.inline[e]&idMask) >= 0 {
			return true
		}
	}
	if n > inlineEntries {
		for _, e := range s.spill[h] {
			if c.at(e&idMask) >= 0 {
				return true
			}
		}
	}
	return false
}

func (s *shard) entryAt(b *block, k int) uint16 {
	if k < inlineEntries {
		return b.inline[k]
	}
	return s.spill[b.hash][k-inlineEntries]
}

func (s *shard) setEntry(b *block, k int, e uint16) {
	if k < inlineEntries {
		b.inline[k] = e
		return
	}
	s.spill[b.hash][k-inlineEntries] = e
}

func (s *shard) indexOf(b *block, id uint16) int {
	n := b.n()
	for k := range min(n, inlineEntries) {
		if b.inline[k]&idMask == id {
			return k
		}
	}
	if n > inlineEntries {
		for k, e := range s.spill[b.hash] {
			if e&idMask == id {
				return inlineEntries + k
			}
		}
	}
	return -1
}

func (s *shard) appendEntry(b *block, e uint16) {
	n := b.n()
	if n < inlineEntries {
		b.inline[n] = e
	} else {
		s.spill[b.hash] = append(s.spill[b.hash], e)
	}
	b.meta++
	s.entries++
}

// addCopy counts one more copy of key's block, within the bounds.
func (s *shard) addCopy(key copyKey) {
	n, ok := s.copies[key]
	if ok && n < math.MaxUint32 || !ok && len(s.copies) < s.maxCopies {
		s.copies[key] = n + 1
	}
}

// forgetCopies drops the copies counted for entry e of block h, in each
// of its tiers.
func (s *shard) forgetCopies(h uint64, e uint16) {
	if len(s.copies) == 0 {
		return
	}
	id := e & idMask
	for _, bit := range [...]uint16{tierGPUBit, tierCPUBit} {
		if e&bit != 0 {
			delete(s.copies, copyKey{h, id | bit})
		}
	}
}

// removeEntry drops entry k, with its copies, by moving the last entry
// into its place.
func (s *shard) removeEntry(b *block, k int) {
	s.forgetCopies(b.hash, s.entryAt(b, k))
	last := b.n() - 1
	s.setEntry(b, k, s.entryAt(b, last))
	if last >= inlineEntries {
		if sp := s.spill[b.hash][:last-inlineEntries]; len(sp) == 0 {
			delete(s.spill, b.hash)
		} else {
			s.spill[b.hash] = sp
		}
	}
	b.meta--
	s.entries--
}

// add records that endpoint id holds one more copy of block h in the tier
// of bit and marks the block referenced, then evicts while the shard is
// over its bound.
func (s *shard) add(h, m uint64, id, bit uint16) {
	i := s.find(h, m)
	if i < 0 {
		i = s.insert(h, m)
	}
	b := &s.slots[i]
	b.meta |= refBit
	if k := s.indexOf(b, id); k >= 0 {
		if e := s.entryAt(b, k); e&bit == 0 {
			s.setEntry(b, k, e|bit)
		} else {
			s.addCopy(copyKey{h, id | bit})
		}
	} else {
		s.appendEntry(b, id|bit)
	}
	for s.entries > s.maxEntries {
		s.evictOne()
	}
}

// evictOne frees the first unreferenced block at or after the hand,
// clearing the reference bits it passes (CLOCK, an approximation of least
// recently stored). One full turn clears every bit, so it always ends.
func (s *shard) evictOne() {
	mask := len(s.slots) - 1
	for {
		b := &s.slots[s.hand]
		if b.meta&countMask != 0 {
			if b.meta&refBit == 0 {
				s.free(s.hand)
				s.evictions++
				return
			}
			b.meta &^= refBit
		}
		s.hand = (s.hand + 1) & mask
	}
}

// remove drops one copy of block h that endpoint id holds in the tier of
// bit, and the tier once its last copy goes.
func (s *shard) remove(h, m uint64, id, bit uint16) {
	i := s.find(h, m)
	if i < 0 {
		return
	}
	b := &s.slots[i]
	k := s.indexOf(b, id)
	if k < 0 {
		return
	}
	if len(s.copies) > 0 {
		key := copyKey{h, id | bit}
		switch n := s.copies[key]; n {
		case 0:
		case 1:
			delete(s.copies, key)
			return
		default:
			s.copies[key] = n - 1
			return
		}
	}
	if e := s.entryAt(b, k) &^ bit; e&tierMask != 0 {
		s.setEntry(b, k, e)
		return
	}
	s.removeEntry(b, k)
	if b.n() == 0 {
		s.free(i)
	}
}

// sweep drops endpoint id from every block of the shard.
func (s *shard) sweep(id uint16) {
	s.sweepEntries(id, func(b *block, k int) bool {
		s.removeEntry(b, k)
		return true
	})
}

// sweepTier drops the tier of bit from endpoint id's entries, with the
// copies counted in it, and the entries left in no tier.
func (s *shard) sweepTier(id, bit uint16) {
	s.sweepEntries(id, func(b *block, k int) bool {
		e := s.entryAt(b, k)
		if e&bit == 0 {
			return false
		}
		if rest := e &^ bit; rest&tierMask != 0 {
			delete(s.copies, copyKey{b.hash, id | bit})
			s.setEntry(b, k, rest)
			return false
		}
		s.removeEntry(b, k)
		return true
	})
}

// sweepEntries calls drop on endpoint id's entry in every block of the
// shard; drop reports whether it removed the entry. It holds the lock for
// the whole pass: deletions move records, so a pass interleaved with other
// writers could step over one.
func (s *shard) sweepEntries(id uint16, drop func(b *block, k int) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < len(s.slots); {
		b := &s.slots[i]
		if b.meta&countMask != 0 {
			if k := s.indexOf(b, id); k >= 0 && drop(b, k) && b.n() == 0 {
				// A record from further on may move into slot i: look
				// at it again.
				s.free(i)
				continue
			}
		}
		i++
	}
}

// bytes estimates the shard's memory: the table and the spill lists (a
// map slot with its slice header counted as 72 bytes, the backing array
// rounded up to the allocator's 8-byte size classes).
func (s *shard) bytes() int64 {
	n := int64(len(s.slots))*blockBytes + int64(len(s.copies))*copyBytes
	for _, sp := range s.spill {
		n += 72 + int64(cap(sp)*2+7)&^7
	}
	return n
}

// mix64 is the splitmix64 finalizer: it spreads hashes that are not uniform
// (test sequences, truncated ids) over shards and table slots. The top bits
// pick the shard and the low bits the slot.
func mix64(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
