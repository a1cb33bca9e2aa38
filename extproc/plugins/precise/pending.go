package precise

import "sync"

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
type pending struct {
	mu sync.RWMutex
	// blocks counts, per endpoint address, the routed requests holding each
	// sample hash; entries is the sum of all counts.
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
	// An endpoint's emptied map stays until the endpoint is forgotten:
	// its next request would otherwise allocate it again.
}

// extend raises runs[i] to the number of leading hashes pending on
// addrs[i] where that is longer, adding the extra blocks to weights[i] at
// full weight (blocks being computed count in full: a later request routed
// there waits for them in the same queue). One read lock for all
// candidates: the decision's hot path.
func (p *pending) extend(addrs []string, hashes []uint64, runs []int, weights []float64) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.entries == 0 {
		return
	}
	for i, a := range addrs {
		m := p.blocks[a]
		if m == nil {
			continue
		}
		n := 0
		for n < len(hashes) && m[hashes[n]] > 0 {
			n++
		}
		if n > runs[i] {
			weights[i] += float64(n - runs[i])
			runs[i] = n
		}
	}
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
