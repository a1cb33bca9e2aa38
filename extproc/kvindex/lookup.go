package kvindex

import "time"

// lookupScratch is one Lookup's working memory, pooled so that Lookup does
// not allocate. Arrays are indexed by endpoint id; stamp tells which ids are
// this call's candidates still matching, so nothing needs clearing between
// calls.
type lookupScratch struct {
	gen    uint32
	stamp  [MaxEndpoints + 1]uint32
	pos    [MaxEndpoints + 1]int32 // candidate's position in endpoints
	hit    [MaxEndpoints + 1]int32 // last block index the id matched, plus one
	active []uint16
	// initial keeps the candidates' ids for LookupRuns.
	initial []uint16
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
	return idx.lookup(hashes, endpoints, out, nil)
}

// LookupRuns is Lookup that also sets runs[i] to the number of leading
// hashes endpoints[i] holds, whatever their tier. A caller that looks up a
// sample of a prompt's blocks needs the run length to find the last
// matched sample's block index; out alone mixes tiers into the count.
func (idx *Index) LookupRuns(hashes []uint64, endpoints []string, out []float64, runs []int) int {
	runs = runs[:len(endpoints)]
	clear(runs)
	return idx.lookup(hashes, endpoints, out, runs)
}

func (idx *Index) lookup(hashes []uint64, endpoints []string, out []float64, runs []int) int {
	start := time.Now()
	matched := idx.walk(hashes, endpoints, out, runs)
	idx.act.lookups.Add(1)
	idx.act.hits.Add(uint64(matched))
	idx.act.latency.observe(time.Since(start))
	return matched
}

func (idx *Index) walk(hashes []uint64, endpoints []string, out []float64, runs []int) int {
	out = out[:len(endpoints)]
	clear(out)
	sc := idx.scratch.Get().(*lookupScratch)
	defer idx.scratch.Put(sc)
	sc.gen++
	if sc.gen == 0 {
		sc.stamp = [MaxEndpoints + 1]uint32{}
		sc.gen = 1
	}
	gen := sc.gen
	active := sc.active[:0]

	// epMu stays read-locked for the whole walk: ClearEndpoint frees an
	// id only under the write lock, so no id resolved here can be handed
	// to another endpoint (and match its blocks) before the walk ends.
	idx.epMu.RLock()
	defer idx.epMu.RUnlock()
	for i, ep := range endpoints {
		id, ok := idx.ids[ep]
		if !ok || sc.stamp[id] == gen {
			continue
		}
		sc.stamp[id] = gen
		sc.pos[id] = int32(i)
		sc.hit[id] = 0
		active = append(active, id)
	}
	if runs != nil {
		sc.initial = append(sc.initial[:0], active...)
	}

	// Holding every shard's read lock for the whole walk, taken in shard
	// order so that lookups never deadlock one another, is cheaper than a
	// lock round trip per block: the atomic operations would fence the loop
	// and stop the processor from overlapping the blocks' cache misses.
	// Writers lock one shard at a time, so they wait at most one lookup.
	for _, s := range idx.shards {
		s.mu.RLock()
	}
	matched := 0
	var touched uint16
	for i, h := range hashes {
		if len(active) == 0 {
			break
		}
		// A block's record usually misses the cache. Reading the home slot
		// of block i+lookAhead now, unused until then, starts that miss
		// while this block is scored instead of after.
		if j := i + lookAhead; j < len(hashes) {
			mj := mix64(hashes[j])
			sj := idx.shardOf(mj)
			touched += sj.slots[int(mj)&(len(sj.slots)-1)].meta
		}
		m := mix64(h)
		s := idx.shardOf(m)
		mark := int32(i + 1)
		if k := s.find(h, m); k >= 0 {
			b := &s.slots[k]
			n := b.n()
			for e := range min(n, inlineEntries) {
				score(sc, gen, mark, b.inline[e], out)
			}
			if n > inlineEntries {
				for _, e := range s.spill[h] {
					score(sc, gen, mark, e, out)
				}
			}
		}

		// Candidates that missed this block stop matching.
		kept := active[:0]
		for _, id := range active {
			if sc.hit[id] == mark {
				kept = append(kept, id)
			} else {
				sc.stamp[id] = 0
			}
		}
		active = kept
		if len(active) > 0 {
			matched = i + 1
		}
	}
	for _, s := range idx.shards {
		s.mu.RUnlock()
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

func score(sc *lookupScratch, gen uint32, mark int32, e uint16, out []float64) {
	id := e & idMask
	if sc.stamp[id] != gen {
		return
	}
	sc.hit[id] = mark
	if e&tierGPUBit != 0 {
		out[sc.pos[id]] += WeightGPU
	} else {
		out[sc.pos[id]] += WeightCPU
	}
}
