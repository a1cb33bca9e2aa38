package tokenizer

import (
	"container/heap"
)

// mergeKey packs the ids of an adjacent symbol pair.
func mergeKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// merge is the outcome of merging a pair: its priority and the new symbol.
type merge struct {
	rank int32
	id   int32
}

// bpeModel applies rank-ordered merges to one pre-token.
type bpeModel struct {
	merges       map[uint64]merge
	byteID       [256]int32 // id of each single-byte token
	vocab        map[string]int32
	ignoreMerges bool
}

// smallWord is the length up to which the quadratic scan beats the heap; most
// words are a handful of bytes.
const smallWord = 48

// appendWord appends the ids of the pre-token word (raw bytes).
func (m *bpeModel) appendWord(dst []int, word string) []int {
	if m.ignoreMerges {
		if id, ok := m.vocab[byteLevelString(word)]; ok {
			return append(dst, int(id))
		}
	}
	if len(word) == 1 {
		return append(dst, int(m.byteID[word[0]]))
	}
	if len(word) <= smallWord {
		return m.appendSmall(dst, word)
	}
	return m.appendLarge(dst, word)
}

// appendSmall merges by repeatedly scanning for the best-ranked pair.
func (m *bpeModel) appendSmall(dst []int, word string) []int {
	var buf [smallWord]int32
	syms := buf[:len(word)]
	for i := 0; i < len(word); i++ {
		syms[i] = m.byteID[word[i]]
	}
	for len(syms) > 1 {
		best, bestAt := merge{rank: -1}, -1
		for i := 0; i+1 < len(syms); i++ {
			if mg, ok := m.merges[mergeKey(syms[i], syms[i+1])]; ok && (bestAt < 0 || mg.rank < best.rank) {
				best, bestAt = mg, i
			}
		}
		if bestAt < 0 {
			break
		}
		syms[bestAt] = best.id
		syms = append(syms[:bestAt+1], syms[bestAt+2:]...)
	}
	for _, s := range syms {
		dst = append(dst, int(s))
	}
	return dst
}

// pairItem is a candidate merge of the symbol at pos with its successor,
// valid only while both symbols still hold the ids it was computed from.
type pairItem struct {
	rank        int32
	pos         int32
	left, right int32
	id          int32
}

type pairHeap []pairItem

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos // equal ranks merge left to right, as HF does
}
func (h pairHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(pairItem)) }
func (h *pairHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// appendLarge is the O(n log n) variant for long pre-tokens (runs of spaces,
// long identifiers) where the quadratic scan would stall.
func (m *bpeModel) appendLarge(dst []int, word string) []int {
	n := len(word)
	ids := make([]int32, n)
	next := make([]int32, n)
	prev := make([]int32, n)
	for i := 0; i < n; i++ {
		ids[i] = m.byteID[word[i]]
		next[i] = int32(i + 1)
		prev[i] = int32(i - 1)
	}
	next[n-1] = -1
	h := make(pairHeap, 0, n)
	candidate := func(i int32) (pairItem, bool) {
		j := next[i]
		if j < 0 {
			return pairItem{}, false
		}
		mg, ok := m.merges[mergeKey(ids[i], ids[j])]
		return pairItem{rank: mg.rank, pos: i, left: ids[i], right: ids[j], id: mg.id}, ok
	}
	for i := int32(0); i < int32(n-1); i++ {
		if it, ok := candidate(i); ok {
			h = append(h, it)
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		it := heap.Pop(&h).(pairItem)
		i := it.pos
		j := next[i]
		if ids[i] != it.left || j < 0 || ids[j] != it.right {
			continue // stale: one side was merged away since
		}
		ids[i] = it.id
		ids[j] = -1
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		if prev[i] >= 0 {
			if it, ok := candidate(prev[i]); ok {
				heap.Push(&h, it)
			}
		}
		if it, ok := candidate(i); ok {
			heap.Push(&h, it)
		}
	}
	for i := int32(0); i >= 0; i = next[i] {
		dst = append(dst, int(ids[i]))
	}
	return dst
}
