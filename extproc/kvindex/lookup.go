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
	pos   [MaxEndpoints + 1]int32 // the id's candidate position
	// active are the ids still matching; initial the ids that matched
	// block 0, for LookupRuns.
	active  []uint16
	initial []uint16
	// locked are the shards the walk holds (a bitset by shard index).
	locked []uint64
	// cands resolves names for Lookup and LookupRuns, and a stale
	// Candidates again.
	cands Candidates
	// touched keeps the look-ahead reads from being optimised away.
	touched uint16
}

// lookAhead is how many blocks ahead Lookup touches the index, and how
// many it touches at once.
const lookAhead = 16

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
	sc.cands.names = nil // a stale c's names, resolved again there
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
	// at most one lookup. A short prompt's blocks fall in few shards, a
	// long one's in all.
	sc.locked = sc.locked[:0]
	for range (len(idx.shards) + 63) / 64 {
		sc.locked = append(sc.locked, 0)
	}
	if len(hashes) >= 2*len(idx.shards) {
		for i := range idx.shards {
			sc.locked[i/64] |= 1 << (i % 64)
		}
	} else {
		for _, h := range hashes {
			si := idx.shardIndex(mix64(h))
			sc.locked[si/64] |= 1 << (si % 64)
		}
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
	// A block's record usually misses the cache. The home slots of the
	// blocks of the group after this one are read in one burst, unused
	// until then, so that their misses overlap one another and the
	// scoring of the blocks before them: reads spread over the loop would
	// each hold up the processor's reorder window until they complete,
	// one at a time.
	var mixes [2 * lookAhead]uint64
	ahead := 0 // the first block not yet touched
	for i, h := range hashes {
		if i > 0 && len(active) == 0 {
			break
		}
		if i%lookAhead == 0 { // touch up to a group past this one
			for end := min(i+2*lookAhead, len(hashes)); ahead < end; ahead++ {
				mj := mix64(hashes[ahead])
				mixes[ahead%len(mixes)] = mj
				sj := idx.shardOf(mj)
				touched += sj.slots[int(mj)&(len(sj.slots)-1)].meta
			}
		}
		m := mixes[i%len(mixes)]
		s := idx.shardOf(m)
		k := s.find(h, m)
		if i == 0 {
			// Block 0's holders that are candidates start matching.
			if k >= 0 {
				inline, spill := s.entriesAt(k)
				active = sc.start(c, gen, inline, out, active)
				active = sc.start(c, gen, spill, out, active)
			}
			sc.initial = append(sc.initial[:0], active...)
		} else {
			mark := int32(i + 1)
			if k >= 0 {
				inline, spill := s.entriesAt(k)
				sc.extend(gen, mark, inline, out)
				sc.extend(gen, mark, spill, out)
			}
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
			runs[sc.pos[id]] = int(sc.hit[id])
		}
	}
	return matched
}

// start makes the candidates among entries, block 0's, start matching.
func (sc *lookupScratch) start(c *Candidates, gen uint32, entries []uint16, out []float64, active []uint16) []uint16 {
	for _, e := range entries {
		id := e & idMask
		p := c.at(id)
		if p < 0 {
			continue
		}
		sc.stamp[id], sc.hit[id], sc.pos[id] = gen, 1, p
		out[p] += weight(e)
		active = append(active, id)
	}
	return active
}

// extend extends the runs of the candidates among entries, block
// mark−1's, that held the block before.
func (sc *lookupScratch) extend(gen uint32, mark int32, entries []uint16, out []float64) {
	for _, e := range entries {
		id := e & idMask
		if sc.stamp[id] == gen && sc.hit[id] == mark-1 {
			sc.hit[id] = mark
			out[sc.pos[id]] += weight(e)
		}
	}
}

// weight is what entry e's block scores: a GPU block WeightGPU, a block
// held only on CPU WeightCPU.
func weight(e uint16) float64 {
	if e&tierGPUBit != 0 {
		return WeightGPU
	}
	return WeightCPU
}
