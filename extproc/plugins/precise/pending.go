package precise

import "sync"

// pending is the speculative half of the precise match: the prefix blocks of
// requests routed to an endpoint that have not produced their first token.
// The server computes them before any request routed there later, so for
// that later request they are as good as cached; but their KV events only
// arrive when the prefill ends. Without them, a burst of requests sharing a
// new prefix finds no endpoint holding it and spreads out, each endpoint
// computing the prefix again. llm-d calls this speculative indexing.
//
// Entries are added at PreRequest and removed at the request's first token
// or the end of its response, whichever comes first; the count bound keeps a
// flood of stalled requests from growing it without limit.
type pending struct {
	mu sync.RWMutex
	// blocks counts, per endpoint address, the routed requests holding each
	// sample hash.
	blocks  map[string]map[uint64]int32
	entries int
	max     int
}

func newPending(max int) *pending {
	return &pending{blocks: map[string]map[uint64]int32{}, max: max}
}

// add records hashes as pending on addr; it reports false (and records
// nothing) when the bound is reached.
func (p *pending) add(addr string, hashes []uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.entries+len(hashes) > p.max {
		return false
	}
	m := p.blocks[addr]
	if m == nil {
		m = make(map[uint64]int32, len(hashes))
		p.blocks[addr] = m
	}
	for _, h := range hashes {
		m[h]++
	}
	p.entries += len(hashes)
	return true
}

// remove undoes one add of the same hashes.
func (p *pending) remove(addr string, hashes []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.blocks[addr]
	if m == nil {
		return
	}
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
	if len(m) == 0 {
		delete(p.blocks, addr)
	}
}

// run is how many leading hashes are pending on addr.
func (p *pending) run(addr string, hashes []uint64) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	m := p.blocks[addr]
	if m == nil {
		return 0
	}
	n := 0
	for n < len(hashes) && m[hashes[n]] > 0 {
		n++
	}
	return n
}

// forget drops an endpoint's entries.
func (p *pending) forget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.blocks[addr] {
		p.entries -= int(n)
	}
	delete(p.blocks, addr)
}
