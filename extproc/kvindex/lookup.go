package kvindex

import (
	"math/bits"
	"time"
)

// Candidates are endpoint addresses resolved to the index's endpoint ids,
// so that a lookup touches only the candidates holding a prompt's blocks
// rather than every candidate: resolve a candidate set once (Resolve) and
// look it up many times (LookupCandidates) while Current holds. The index
// changes its ids only when an endpoint publishes for the first time or is
// cleared, so a candidate set stays current across many decisions. A stale
// set is still looked up correctly, at the cost of resolving it again
// inside the lookup.
//
// A Candidates is not modified by lookups: once resolved it may be read by
// any number of goroutines.
type Candidates struct {
	names []string
	gen   uint64
	// pos is, by endpoint id, the position in names of the first
	// candidate with that id, or -1; ids past its end are no candidate's.
	pos []int32
}

// Len is the number of candidates.
func (c *Candidates) Len() int { return len(c.names) }

// Current reports whether the index's ids are still those c was resolved
// against.
func (c *Candidates) Current(idx *Index) bool { return c.gen == idx.gen.Load() }

// Resolve resolves names (kept, not copied) into c, reusing c's memory.
func (idx *Index) Resolve(c *Candidates, names []string) {
	idx.epMu.RLock()
	idx.resolveLocked(c, names)
	idx.epMu.RUnlock()
}

// resolveLocked is Resolve with epMu held.
func (idx *Index) resolveLocked(c *Candidates, names []string) {
	c.names, c.gen = names, idx.gen.Load()
	c.pos = c.pos[:0]
	for i, name := range names {
		id, ok := idx.ids[name]
		if !ok {
			continue
		}
		for len(c.pos) <= int(id) {
			c.pos = append(c.pos, -1)
		}
		if c.pos[id] < 0 {
			c.pos[id] = int32(i)
		}
	}
}

// at is the position of the candidate with endpoint id id, or -1.
func (c *Candidates) at(id uint16) int32 {
	if int(id) < len(c.pos) {
		return c.pos[id]
	}
	return -1
}

// lookupScratch is one Lookup's working memory, pooled so that Lookup does
// not allocate. Arrays are indexed by endpoint id; stamp tells which ids
// this call has seen match block 0, so nothing needs clearing between
// calls.
type lookupScratch struct {
	gen   uint32
	stamp [MaxEndpoints + 1]uint32
	hit   [MaxEndpoints + 1]int32 // last block index the id matched, plus one
	// active are the ids still matching; initial the ids that matched
	// block 0, for LookupRuns.
	active  []uint16
	initial []uint16
	// mix holds each hash's mix64 and locked the shards the walk holds
	// (a bitset by shard index).
	mix    []uint64
	locked []uint64
	// cands resolves names for Lookup and LookupRuns, and a stale
	// Candidates again.
	cands Candidates
	// touched keeps the look-ahead reads from being optimised away.
	touched uint16
}

// lookAhead is how many blocks ahead Lookup touches the index.
const lookAhead = 4

// Lookup scores candidate endpoints against a prompt's block hashes (in
// prompt order, block 0 first). For each endpoints[i] it sets out[i] to the
// tier-weighted length of the run of leading blocks the endpoint holds: a
// GPU block counts WeightGPU, a block held only on CPU WeightCPU. It returns
// how many leading blocks at least one candidate holds, and stops reading
// the index as soon as no candidate matches. out must have room for
// len(endpoints) values; a repeated endpoint scores only at its first
// position.
func (idx *Index) Lookup(hashes []uint64, endpoints []string, out []float64) int {
	return idx.lookupNames(hashes, endpoints, out, nil)
}

// LookupRuns is Lookup that also sets runs[i] to the number of leading
// hashes endpoints[i] holds, whatever their tier. A caller that looks up a
// sample of a prompt's blocks needs the run length to find the last
// matched sample's block index; out alone mixes tiers into the count.
func (idx *Index) LookupRuns(hashes []uint64, endpoints []string, out []float64, runs []int) int {
	return idx.lookupNames(hashes, endpoints, out, runs[:len(endpoints)])
}

// LookupCandidates is LookupRuns over resolved candidates: out and runs
// are indexed like the names c was resolved from. It reads only the
// entries of the blocks it walks, whatever the number of candidates.
func (idx *Index) LookupCandidates(hashes []uint64, c *Candidates, out []float64, runs []int) int {
	start := time.Now()
	sc := idx.scratch.Get().(*lookupScratch)
	matched := idx.walk(sc, hashes, c, false, out[:c.Len()], runs[:c.Len()])
	idx.scratch.Put(sc)
	idx.observe(start, matched)
	return matched
}

func (idx *Index) lookupNames(hashes []uint64, endpoints []string, out []float64, runs []int) int {
	start := time.Now()
	sc := idx.scratch.Get().(*lookupScratch)
	sc.cands.names = endpoints
	matched := idx.walk(sc, hashes, &sc.cands, true, out[:len(endpoints)], runs)
	sc.cands.names = nil
	idx.scratch.Put(sc)
	idx.observe(start, matched)
	return matched
}

func (idx *Index) observe(start time.Time, matched int) {
	idx.act.lookups.Add(1)
	idx.act.hits.Add(uint64(matched))
	idx.act.latency.observe(time.Since(start))
}

// walk is the lookup. c is resolved here first when resolve is set (it is
// then sc.cands), or again when it is stale. runs may be nil.
func (idx *Index) walk(sc *lookupScratch, hashes []uint64, c *Candidates, resolve bool, out []float64, runs []int) int {
	clear(out)
	clear(runs)
	if len(hashes) == 0 || len(out) == 0 {
		return 0
	}
	// epMu stays read-locked for the whole walk: ClearEndpoint frees an
	// id only under the write lock, so no id resolved here can be handed
	// to another endpoint (and match its blocks) before the walk ends.
	idx.epMu.RLock()
	defer idx.epMu.RUnlock()
	if resolve || c.gen != idx.gen.Load() {
		idx.resolveLocked(&sc.cands, c.names)
		c = &sc.cands
	}

	// A candidate's run starts at block 0: when no candidate holds it,
	// which is what a prompt no server has seen finds, one shard's lock
	// answers the lookup.
	m0 := mix64(hashes[0])
	s0 := idx.shardOf(m0)
	s0.mu.RLock()
	held := s0.holdsAny(hashes[0], m0, c)
	s0.mu.RUnlock()
	if !held {
		return 0
	}

	// Holding the read locks of the prompt's shards for the whole walk,
	// taken in shard order so that lookups never deadlock one another, is
	// cheaper than a lock round trip per block: the atomic operations
	// would fence the loop and stop the processor from overlapping the
	// blocks' cache misses. Writers lock one shard at a time, so they wait
	// at most one lookup.
	sc.mix = sc.mix[:0]
	sc.locked = sc.locked[:0]
	for range (len(idx.shards) + 63) / 64 {
		sc.locked = append(sc.locked, 0)
	}
	for _, h := range hashes {
		m := mix64(h)
		sc.mix = append(sc.mix, m)
		si := idx.shardIndex(m)
		sc.locked[si/64] |= 1 << (si % 64)
	}
	idx.forLocked(sc.locked, func(s *shard) { s.mu.RLock() })
	matched := idx.walkLocked(sc, hashes, c, out, runs)
	idx.forLocked(sc.locked, func(s *shard) { s.mu.RUnlock() })
	return matched
}

// forLocked calls f on each shard in the bitset, in shard order.
func (idx *Index) forLocked(set []uint64, f func(*shard)) {
	for w, word := range set {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &^= 1 << b
			f(idx.shards[w*64+b])
		}
	}
}

// walkLocked walks the blocks with their shards read-locked. Only block
// 0's holders that are candidates become active; each later block's
// entries extend the runs of the active ones that held the block before.
func (idx *Index) walkLocked(sc *lookupScratch, hashes []uint64, c *Candidates, out []float64, runs []int) int {
	sc.gen++
	if sc.gen == 0 {
		sc.stamp = [MaxEndpoints + 1]uint32{}
		sc.gen = 1
	}
	gen := sc.gen
	active := sc.active[:0]
	matched := 0
	var touched uint16
	for i, h := range hashes {
		if i > 0 && len(active) == 0 {
			break
		}
		// A block's record usually misses the cache. Reading the home slot
		// of block i+lookAhead now, unused until then, starts that miss
		// while this block is scored instead of after.
		if j := i + lookAhead; j < len(hashes) {
			mj := sc.mix[j]
			sj := idx.shardOf(mj)
			touched += sj.slots[int(mj)&(len(sj.slots)-1)].meta
		}
		m := sc.mix[i]
		s := idx.shardOf(m)
		mark := int32(i + 1)
		if k := s.find(h, m); k >= 0 {
			b := &s.slots[k]
			n := b.n()
			for e := range min(n, inlineEntries) {
				active = score(sc, c, gen, mark, b.inline[e], out, active)
			}
			if n > inlineEntries {
				for _, e := range s.spill[h] {
					active = score(sc, c, gen, mark, e, out, active)
				}
			}
		}
		if i == 0 {
			sc.initial = append(sc.initial[:0], active...)
		} else {
			// Candidates that missed this block stop matching.
			kept := active[:0]
			for _, id := range active {
				if sc.hit[id] == mark {
					kept = append(kept, id)
				}
			}
			active = kept
		}
		if len(active) > 0 {
			matched = i + 1
		}
	}
	sc.active = active[:0]
	sc.touched = touched
	if runs != nil {
		// A candidate's hit mark is the 1-based index of the last block it
		// matched before it dropped out (or the walk ended).
		for _, id := range sc.initial {
			runs[c.at(id)] = int(sc.hit[id])
		}
	}
	return matched
}

// score counts entry e of block mark−1 (1-based mark) for its endpoint:
// at block 0 a candidate starts matching (and is appended to active),
// after it only one that matched the block before goes on.
func score(sc *lookupScratch, c *Candidates, gen uint32, mark int32, e uint16, out []float64, active []uint16) []uint16 {
	id := e & idMask
	if mark == 1 {
		p := c.at(id)
		if p < 0 {
			return active
		}
		sc.stamp[id] = gen
		active = append(active, id)
	} else if sc.stamp[id] != gen || sc.hit[id] != mark-1 {
		return active
	}
	sc.hit[id] = mark
	if e&tierGPUBit != 0 {
		out[c.at(id)] += WeightGPU
	} else {
		out[c.at(id)] += WeightCPU
	}
	return active
}
