package prefix

import (
	"container/list"
	"slices"
	"sync"
)

// indexer remembers which block hashes the picker sent to which server: a
// per-server LRU bounded by its capacity, plus a reverse map from hash to the
// servers holding it so that a lookup costs O(matched blocks × holders), not
// O(servers × blocks).
//
// Concurrency: one RWMutex; lookups share it, additions and removals take it
// exclusively. Memory is bounded by Σ server capacities.
type indexer struct {
	mu      sync.RWMutex
	blocks  map[uint64][]uint32 // hash → ids of servers holding it
	servers map[string]*serverLRU
	byID    []*serverLRU // id → server; nil for freed ids
	freeIDs []uint32
}

type serverLRU struct {
	id    uint32
	name  string
	order *list.List // front = most recent; values are uint64 hashes
	nodes map[uint64]*list.Element
}

func newIndexer() *indexer {
	return &indexer{blocks: map[uint64][]uint32{}, servers: map[string]*serverLRU{}}
}

// add records that server now holds hashes, evicting its least recently
// added hashes beyond capacity.
func (x *indexer) add(server string, hashes []uint64, capacity int) {
	if len(hashes) == 0 || capacity <= 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.servers[server]
	if s == nil {
		s = &serverLRU{name: server, order: list.New(), nodes: map[uint64]*list.Element{}}
		if n := len(x.freeIDs); n > 0 {
			s.id, x.freeIDs = x.freeIDs[n-1], x.freeIDs[:n-1]
			x.byID[s.id] = s
		} else {
			s.id = uint32(len(x.byID))
			x.byID = append(x.byID, s)
		}
		x.servers[server] = s
	}
	for _, h := range hashes {
		if el, ok := s.nodes[h]; ok {
			s.order.MoveToFront(el)
			continue
		}
		s.nodes[h] = s.order.PushFront(h)
		x.blocks[h] = append(x.blocks[h], s.id)
	}
	for s.order.Len() > capacity {
		x.evict(s, s.order.Back())
	}
}

func (x *indexer) evict(s *serverLRU, el *list.Element) {
	h := el.Value.(uint64)
	s.order.Remove(el)
	delete(s.nodes, h)
	holders := x.blocks[h]
	for i, id := range holders {
		if id == s.id {
			holders[i] = holders[len(holders)-1]
			holders = holders[:len(holders)-1]
			break
		}
	}
	if len(holders) == 0 {
		delete(x.blocks, h)
	} else {
		x.blocks[h] = holders
	}
}

// remove forgets a server entirely.
func (x *indexer) remove(server string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.servers[server]
	if s == nil {
		return
	}
	for s.order.Len() > 0 {
		x.evict(s, s.order.Back())
	}
	delete(x.servers, server)
	x.byID[s.id] = nil
	x.freeIDs = append(x.freeIDs, s.id)
}

// match writes, for each server in names, how many leading hashes it holds
// consecutively from the first. slot is scratch the caller owns.
//
// Only the servers holding a matched block are looked up among the
// candidates, lazily: most candidates hold nothing of a given prompt, and
// resolving every one of them by name costs more than the whole match.
// Candidates usually come sorted by name (the datastore's order), which
// makes each lookup a binary search.
func (x *indexer) match(hashes []uint64, names []string, matched []int, slot []int32) []int32 {
	clear(matched[:len(names)])
	x.mu.RLock()
	defer x.mu.RUnlock()
	if cap(slot) < len(x.byID) {
		slot = make([]int32, len(x.byID))
	}
	slot = slot[:len(x.byID)]
	for i := range slot {
		slot[i] = unresolved
	}
	sorted := slices.IsSorted(names)
	position := func(id uint32) int32 {
		if slot[id] == unresolved {
			slot[id] = notCandidate
			if s := x.byID[id]; s != nil {
				if i, ok := find(names, s.name, sorted); ok {
					slot[id] = int32(i)
				}
			}
		}
		return slot[id]
	}
	for depth, h := range hashes {
		advanced := false
		for _, id := range x.blocks[h] {
			if c := position(id); c >= 0 && matched[c] == depth {
				matched[c] = depth + 1
				advanced = true
			}
		}
		if !advanced {
			break
		}
	}
	return slot
}

// size is the number of (hash, server) entries held.
func (x *indexer) size() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := 0
	for _, s := range x.servers {
		n += s.order.Len()
	}
	return n
}

// Slot markers of match.
const (
	unresolved   = -2
	notCandidate = -1
)

// find is the position of name in names.
func find(names []string, name string, sorted bool) (int, bool) {
	if sorted {
		i, ok := slices.BinarySearch(names, name)
		return i, ok
	}
	i := slices.Index(names, name)
	return i, i >= 0
}
