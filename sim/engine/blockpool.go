package engine

import "github.com/kvgate/kvgate/internal/kvhash"

const noBlock int32 = -1

// block is one KV page. A block is referenced by the requests using it;
// with no references it sits in the free queue, and if it still carries a
// hash it remains a prefix-cache hit until it is reused.
type block struct {
	prev, next int32 // free-queue links
	ref        int32
	free       bool
	hashed     bool
	hash       kvhash.Hash
}

// blockPool is vLLM's BlockPool: a fixed array of blocks, a free queue whose
// head is the least recently freed block (the next to be reused, which
// evicts its cached content) and a hash → block map for prefix hits.
//
// The map holds one block per hash; when two requests compute the same
// block at once, the second copy waits in dups so that it can take over the
// hash when the first is evicted, as vLLM's multi-entry map does.
type blockPool struct {
	blocks     []block
	head, tail int32
	numFree    int
	cached     map[kvhash.Hash]int32
	dups       map[kvhash.Hash][]int32
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{
		blocks: make([]block, n),
		head:   noBlock, tail: noBlock,
		cached: make(map[kvhash.Hash]int32, n),
		dups:   make(map[kvhash.Hash][]int32),
	}
	for i := range p.blocks {
		p.blocks[i].prev, p.blocks[i].next = noBlock, noBlock
		p.pushTail(int32(i))
	}
	return p
}

func (p *blockPool) pushTail(id int32) {
	b := &p.blocks[id]
	b.free, b.prev, b.next = true, p.tail, noBlock
	if p.tail != noBlock {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.numFree++
}

func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev != noBlock {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next != noBlock {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.free, b.prev, b.next = false, noBlock, noBlock
	p.numFree--
}

// used is the number of blocks referenced by at least one request.
func (p *blockPool) used() int { return len(p.blocks) - p.numFree }

// longestHit appends to dst the cached blocks of the longest prefix of
// hashes, stopping at the first miss.
func (p *blockPool) longestHit(dst []int32, hashes []kvhash.Hash) []int32 {
	for _, h := range hashes {
		id, ok := p.cached[h]
		if !ok {
			break
		}
		dst = append(dst, id)
	}
	return dst
}

// evictableAmong counts blocks in ids that are free, i.e. that touching
// would take out of the free queue.
func (p *blockPool) evictableAmong(ids []int32) int {
	n := 0
	for _, id := range ids {
		if p.blocks[id].ref == 0 {
			n++
		}
	}
	return n
}

// touch takes a reference on prefix-hit blocks.
func (p *blockPool) touch(ids []int32) {
	for _, id := range ids {
		b := &p.blocks[id]
		if b.ref == 0 && b.free {
			p.unlink(id)
		}
		b.ref++
	}
}

// alloc takes n blocks from the head of the free queue, evicting whatever
// they cached; the caller has checked that n blocks are free. Evicted
// hashes are reported through evict.
func (p *blockPool) alloc(dst []int32, n int, evict func(kvhash.Hash)) []int32 {
	for range n {
		id := p.head
		p.unlink(id)
		b := &p.blocks[id]
		if b.hashed {
			p.uncache(id)
			evict(b.hash)
		}
		b.ref = 1
		dst = append(dst, id)
	}
	return dst
}

func (p *blockPool) uncache(id int32) {
	b := &p.blocks[id]
	b.hashed = false
	if p.cached[b.hash] == id {
		delete(p.cached, b.hash)
		if d := p.dups[b.hash]; len(d) > 0 {
			p.cached[b.hash] = d[len(d)-1]
			p.shrinkDups(b.hash, len(d)-1)
		}
		return
	}
	d := p.dups[b.hash]
	for i, x := range d {
		if x == id {
			d[i] = d[len(d)-1]
			p.shrinkDups(b.hash, len(d)-1)
			return
		}
	}
}

func (p *blockPool) shrinkDups(h kvhash.Hash, n int) {
	if n == 0 {
		delete(p.dups, h)
		return
	}
	p.dups[h] = p.dups[h][:n]
}

// cache registers a newly full block under its hash.
func (p *blockPool) cache(id int32, h kvhash.Hash) {
	b := &p.blocks[id]
	b.hashed, b.hash = true, h
	if _, ok := p.cached[h]; ok {
		p.dups[h] = append(p.dups[h], id)
		return
	}
	p.cached[h] = id
}

// release drops one reference on each block in the given order; blocks
// that reach zero join the free-queue tail in that order, so the first
// released is the first evicted.
func (p *blockPool) release(ids []int32) {
	for _, id := range ids {
		b := &p.blocks[id]
		b.ref--
		if b.ref == 0 {
			p.pushTail(id)
		}
	}
}

// reset forgets every cached hash; it fails if any block is referenced.
func (p *blockPool) reset() bool {
	if p.numFree != len(p.blocks) {
		return false
	}
	for i := range p.blocks {
		p.blocks[i].hashed = false
	}
	clear(p.cached)
	clear(p.dups)
	return true
}
