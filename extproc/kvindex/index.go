package kvindex

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
)

// MaxEndpoints is how many endpoints the index tracks at once; an endpoint's
// id is freed by ClearEndpoint.
const MaxEndpoints = idMask

// ErrTooManyEndpoints is returned by Add when MaxEndpoints endpoints already
// hold entries.
var ErrTooManyEndpoints = errors.New("kvindex: too many endpoints")

// Defaults for a zero Config.
const (
	DefaultMaxEntries = 8 << 20
	DefaultShards     = 64
)

// Config bounds an Index.
type Config struct {
	// MaxEntries bounds the (block, endpoint) pairs held. Each shard holds
	// at most MaxEntries/Shards and beyond that evicts whole blocks, with
	// all their entries, by CLOCK: a block stored since the clock hand
	// last passed it is spared once, approximating least recently stored.
	MaxEntries int
	// Shards is rounded up to a power of two.
	Shards int
}

// Index maps block hashes to endpoints × tiers. All methods are safe for
// concurrent use.
type Index struct {
	shards    []*shard
	shardBits uint

	// epMu guards the endpoint ids. Writers hold it shared for a whole
	// call, so that ClearEndpoint can wait for in-flight writes before it
	// recycles an id.
	epMu   sync.RWMutex
	ids    map[string]uint16
	freeID []uint16
	nextID uint16 // ids below it have been handed out at least once
	// gen counts the changes to ids (written under epMu held
	// exclusively): a Candidates resolved at another count is stale.
	gen atomic.Uint64

	scratch sync.Pool // *lookupScratch

	act activity
}

// New returns an empty index.
func New(cfg Config) *Index {
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.Shards <= 0 {
		cfg.Shards = DefaultShards
	}
	shardBits := uint(bits.Len(uint(cfg.Shards - 1)))
	n := 1 << shardBits
	per := (cfg.MaxEntries + n - 1) / n
	idx := &Index{
		shards:    make([]*shard, n),
		shardBits: shardBits,
		ids:       make(map[string]uint16),
		nextID:    1, // id 0 stays unused so a zeroed scratch never matches
	}
	for i := range idx.shards {
		idx.shards[i] = newShard(per)
	}
	idx.scratch.New = func() any { return new(lookupScratch) }
	return idx
}

func (idx *Index) shardOf(m uint64) *shard { return idx.shards[idx.shardIndex(m)] }

// shardIndex is the shard of a block whose hash mixes to m: its top bits.
func (idx *Index) shardIndex(m uint64) int {
	if idx.shardBits == 0 {
		return 0
	}
	return int(m >> (64 - idx.shardBits))
}

// internLocked returns endpoint's id, assigning one if needed; epMu must be
// held exclusively.
func (idx *Index) internLocked(endpoint string) (uint16, error) {
	if id, ok := idx.ids[endpoint]; ok {
		return id, nil
	}
	var id uint16
	switch {
	case len(idx.freeID) > 0:
		id = idx.freeID[len(idx.freeID)-1]
		idx.freeID = idx.freeID[:len(idx.freeID)-1]
	case idx.nextID <= MaxEndpoints:
		id = idx.nextID
		idx.nextID++
	default:
		return 0, fmt.Errorf("%w (%d) adding %q", ErrTooManyEndpoints, MaxEndpoints, endpoint)
	}
	idx.ids[endpoint] = id
	idx.gen.Add(1)
	return id, nil
}

// Add records that endpoint (its ip:port) holds one more copy of each block
// in tier, and marks each block recently stored for eviction. A block
// stored twice (vLLM can hold two blocks with one hash) stays until both
// copies are removed.
func (idx *Index) Add(endpoint string, tier Tier, hashes []uint64) error {
	idx.epMu.RLock()
	id, ok := idx.ids[endpoint]
	if !ok {
		idx.epMu.RUnlock()
		idx.epMu.Lock()
		var err error
		id, err = idx.internLocked(endpoint)
		idx.epMu.Unlock()
		if err != nil {
			return err
		}
		idx.epMu.RLock()
		// A concurrent ClearEndpoint may have released the id meanwhile.
		if id2, ok := idx.ids[endpoint]; !ok || id2 != id {
			idx.epMu.RUnlock()
			return idx.Add(endpoint, tier, hashes)
		}
	}
	defer idx.epMu.RUnlock()
	idx.act.admissions.Add(uint64(len(hashes)))
	bit := tier.bit()
	for _, h := range hashes {
		m := mix64(h)
		s := idx.shardOf(m)
		s.mu.Lock()
		s.add(h, m, id, bit)
		s.mu.Unlock()
	}
	return nil
}

// Remove records that endpoint dropped one copy of each block in tier; the
// block leaves the tier with its last copy.
func (idx *Index) Remove(endpoint string, tier Tier, hashes []uint64) {
	idx.epMu.RLock()
	defer idx.epMu.RUnlock()
	id, ok := idx.ids[endpoint]
	if !ok {
		return
	}
	idx.act.removals.Add(uint64(len(hashes)))
	bit := tier.bit()
	for _, h := range hashes {
		m := mix64(h)
		s := idx.shardOf(m)
		s.mu.Lock()
		s.remove(h, m, id, bit)
		s.mu.Unlock()
	}
}

// ClearEndpoint drops every entry of endpoint and frees its id. It sweeps
// the whole index, holding one shard at a time, so it is meant for the
// rare events that need it: an endpoint leaving, a publisher restart, lost
// events.
func (idx *Index) ClearEndpoint(endpoint string) {
	// The exclusive lock waits for in-flight Adds of this endpoint; later
	// ones get a fresh id, so nothing re-adds the old id during the sweep.
	idx.epMu.Lock()
	id, ok := idx.ids[endpoint]
	if ok {
		delete(idx.ids, endpoint)
		idx.gen.Add(1)
	}
	idx.epMu.Unlock()
	if !ok {
		return
	}
	for _, s := range idx.shards {
		s.sweep(id)
	}
	idx.epMu.Lock()
	idx.freeID = append(idx.freeID, id)
	idx.epMu.Unlock()
}

// ClearTier drops endpoint's entries in one tier and keeps the others: a
// block it also holds in another tier stays there. vLLM's AllBlocksCleared
// is this for the GPU tier: it resets the block pool, not an offloading
// connector's tiers. Like ClearEndpoint it sweeps the whole index, one
// shard at a time; it keeps the endpoint's id.
func (idx *Index) ClearTier(endpoint string, tier Tier) {
	// Held shared as by Remove: the id cannot be recycled during the sweep.
	idx.epMu.RLock()
	defer idx.epMu.RUnlock()
	id, ok := idx.ids[endpoint]
	if !ok {
		return
	}
	bit := tier.bit()
	for _, s := range idx.shards {
		s.sweepTier(id, bit)
	}
}

// Stats is a snapshot of the index's size.
type Stats struct {
	Entries   int64  // (block, endpoint) pairs
	Blocks    int64  // distinct block hashes
	Bytes     int64  // estimated memory held
	Evictions uint64 // blocks evicted by the bound since New
	Endpoints int    // endpoints with an id
}

// Stats sums the shards; it is meant for metrics scrapes, not hot paths.
func (idx *Index) Stats() Stats {
	var st Stats
	for _, s := range idx.shards {
		s.mu.RLock()
		st.Entries += int64(s.entries)
		st.Blocks += int64(s.used)
		st.Bytes += s.bytes()
		st.Evictions += s.evictions
		s.mu.RUnlock()
	}
	idx.epMu.RLock()
	st.Endpoints = len(idx.ids)
	st.Bytes += int64(len(idx.ids)) * 64
	idx.epMu.RUnlock()
	return st
}
