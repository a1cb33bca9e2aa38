package precise

import (
	"sync"
	"sync/atomic"
)

// pending is the speculative half of the precise match: the prefix blocks of
// requests routed to an endpoint whose response has not ended. The server
// computes them before any request routed there later, so for that later
// request they are as good as cached; but their KV events only arrive after
// the prefill's step, through the event transport. Without them, a burst of
// requests sharing a new prefix finds no endpoint holding it and spreads
// out, each endpoint computing the prefix again. llm-d calls this
// speculative indexing.
//
// Entries are added at PreRequest and removed when the response ends: the
// blocks stay resident while the request runs (it references them), and
// removing them at the first token would open a window, before the KV events
// arrive, in which neither this set nor the index knows of them. The count
// bound keeps a flood of requests from growing it without limit.
//
// A decision reads it through roots: the endpoints with a pending request
// whose first sampled block is the decision's first (a run of held blocks
// starts there), so it touches only those endpoints rather than every
// candidate. The first sample is always block 0, whose hash no later
// block of any prompt shares (each has another parent), so an endpoint
// holding a prompt's block 0 is in its root's list.
type pending struct {
	mu sync.RWMutex
	// ids numbers the endpoints ever given entries or resolved as
	// candidates, until forgotten; eps[id] is that endpoint's state.
	ids  map[string]int32
	eps  []endpointPending
	free []int32
	// gen counts the changes to ids (under mu held exclusively): resolved
	// candidates of another count are stale.
	gen atomic.Uint64
	// roots lists, by the hash of a first sample, the endpoints with
	// pending requests starting with it and how many; spare keeps emptied
	// lists for reuse, so that a prefix that comes and goes allocates
	// none.
	roots map[uint64][]rootHolder
	spare [][]rootHolder
	// entries is the sum of all counts of blocks.
	entries int
	max     int
}

// endpointPending counts, per sample hash, the routed requests holding it
// on one endpoint.
type endpointPending struct {
	addr   string
	blocks map[uint64]int32
}

type rootHolder struct{ id, n int32 }

// maxSpareRoots bounds the emptied root lists kept for reuse.
const maxSpareRoots = 1024

func newPending(max int) *pending {
	return &pending{ids: map[string]int32{}, roots: map[uint64][]rootHolder{}, max: max}
}

// internLocked returns addr's id, giving it one if needed; mu must be held
// exclusively.
func (p *pending) internLocked(addr string) int32 {
	if id, ok := p.ids[addr]; ok {
		return id
	}
	var id int32
	if n := len(p.free); n > 0 {
		id, p.free = p.free[n-1], p.free[:n-1]
		p.eps[id].addr = addr
	} else {
		id = int32(len(p.eps))
		p.eps = append(p.eps, endpointPending{addr: addr})
	}
	p.ids[addr] = id
	p.gen.Add(1)
	return id
}

// add records hashes (a prompt's sample, block 0 first) as pending on
// addr; it reports false (and records nothing) when the bound is reached.
func (p *pending) add(addr string, hashes []uint64) bool {
	if len(hashes) == 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.entries+len(hashes) > p.max {
		return false
	}
	id := p.internLocked(addr)
	ep := &p.eps[id]
	if ep.blocks == nil {
		ep.blocks = make(map[uint64]int32, len(hashes))
	}
	for _, h := range hashes {
		ep.blocks[h]++
	}
	p.entries += len(hashes)
	rs, ok := p.roots[hashes[0]]
	if !ok && len(p.spare) > 0 {
		rs, p.spare = p.spare[len(p.spare)-1], p.spare[:len(p.spare)-1]
	}
	for i := range rs {
		if rs[i].id == id {
			rs[i].n++
			return true
		}
	}
	p.roots[hashes[0]] = append(rs, rootHolder{id: id, n: 1})
	return true
}

// remove undoes one add of the same hashes.
func (p *pending) remove(addr string, hashes []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.ids[addr]
	if !ok || len(hashes) == 0 {
		return
	}
	m := p.eps[id].blocks
	for _, h := range hashes {
		if n, ok := m[h]; ok {
			p.entries--
			if n <= 1 {
				delete(m, h)
			} else {
				m[h] = n - 1
			}
		}
	}
	// An endpoint's emptied map stays until the endpoint is forgotten:
	// its next request would otherwise allocate it again.
	rs := p.roots[hashes[0]]
	for i := range rs {
		if rs[i].id == id {
			if rs[i].n--; rs[i].n == 0 {
				p.setRoot(hashes[0], append(rs[:i], rs[i+1:]...))
			}
			return
		}
	}
}

// setRoot stores a root's list, an emptied one going to the spares.
func (p *pending) setRoot(h uint64, rs []rootHolder) {
	if len(rs) > 0 {
		p.roots[h] = rs
		return
	}
	delete(p.roots, h)
	if len(p.spare) < maxSpareRoots {
		p.spare = append(p.spare, rs)
	}
}

// pendingCandidates are a decision's candidates resolved to pending's ids.
type pendingCandidates struct {
	gen uint64
	// first is, by id, the first candidate position with that id (or −1);
	// next chains a position to the next one with the same address.
	first []int32
	next  []int32
}

// resolve resolves names into c. With intern, every name gets an id (so
// that c stays current when those endpoints get their first entries),
// which takes the write lock: for candidate sets kept across decisions.
func (p *pending) resolve(c *pendingCandidates, names []string, intern bool) {
	if intern {
		p.mu.Lock()
		defer p.mu.Unlock()
	} else {
		p.mu.RLock()
		defer p.mu.RUnlock()
	}
	p.resolveLocked(c, names, intern)
}

func (p *pending) resolveLocked(c *pendingCandidates, names []string, intern bool) {
	c.first = c.first[:0]
	for range p.eps {
		c.first = append(c.first, -1)
	}
	c.next = c.next[:0]
	for range names {
		c.next = append(c.next, -1)
	}
	// Backwards, so that each chain runs in candidate order.
	for i := len(names) - 1; i >= 0; i-- {
		id, ok := p.ids[names[i]]
		if !ok && intern {
			id, ok = p.internLocked(names[i]), true
			for len(c.first) <= int(id) {
				c.first = append(c.first, -1)
			}
		}
		if ok {
			c.next[i], c.first[id] = c.first[id], int32(i)
		}
	}
	c.gen = p.gen.Load()
}

// current reports whether c was resolved against pending's ids as they
// are.
func (p *pending) current(c *pendingCandidates) bool { return c.gen == p.gen.Load() }

// extend raises runs[i] to the number of leading hashes pending on the
// candidate at position i where that is longer, adding the extra blocks to
// weights[i] at full weight (blocks being computed count in full: a later
// request routed there waits for them in the same queue). names are the
// candidates c was resolved from; stale resolves them again into scratch.
// One read lock for all candidates: the decision's hot path.
func (p *pending) extend(c *pendingCandidates, names []string, scratch *pendingCandidates, hashes []uint64, runs []int, weights []float64) {
	if len(hashes) == 0 {
		return
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.entries == 0 {
		return
	}
	rs := p.roots[hashes[0]]
	if len(rs) == 0 {
		return
	}
	if c.gen != p.gen.Load() {
		p.resolveLocked(scratch, names, false)
		c = scratch
	}
	for _, r := range rs {
		if int(r.id) >= len(c.first) || c.first[r.id] < 0 {
			continue // not a candidate
		}
		m := p.eps[r.id].blocks
		n := 1 // the root's list holds the endpoints holding hashes[0]
		for n < len(hashes) && m[hashes[n]] > 0 {
			n++
		}
		for i := c.first[r.id]; i >= 0; i = c.next[i] {
			if n > runs[i] {
				weights[i] += float64(n - runs[i])
				runs[i] = n
			}
		}
	}
}

// forget drops an endpoint's entries and its id.
func (p *pending) forget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.ids[addr]
	if !ok {
		return
	}
	for _, n := range p.eps[id].blocks {
		p.entries -= int(n)
	}
	for h, rs := range p.roots {
		for i := range rs {
			if rs[i].id == id {
				p.setRoot(h, append(rs[:i], rs[i+1:]...))
				break
			}
		}
	}
	p.eps[id] = endpointPending{}
	delete(p.ids, addr)
	p.free = append(p.free, id)
	p.gen.Add(1)
}
