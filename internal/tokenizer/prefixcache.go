package tokenizer

import (
	"container/list"
	"hash/maphash"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"
)

// PrefixCache encodes texts that share long prefixes (a 6k-token system
// prompt in front of every request) without re-tokenizing the shared part.
//
// It remembers, for recently encoded texts, the token count at checkpoints:
// byte offsets where the tokenizer provably splits no matter what text
// follows, so that Encode(text) == Encode(text[:p]) ++ Encode(text[p:]).
// Two kinds of offsets qualify:
//   - the end of an added token (when no added token occurs inside another,
//     so a longer or earlier match cannot swallow it), and
//   - a space (U+0020) right after a non-whitespace rune, when no added token
//     contains a space: no alternative of the split pattern joins a
//     non-space with a following space, every scan that starts before the
//     space stops at it, and a space is an NFC boundary.
//
// Checkpoints are sampled by a hash of the few bytes in front of them, so the
// same text content yields the same checkpoints in every request; each is
// indexed by a hash of the whole prefix up to it and verified byte for byte
// before use. Results are therefore identical to Tokenizer.Encode.
//
// Memory is bounded by maxBytes (cached text, 4 bytes per token and 32 per
// checkpoint); the least recently used texts are evicted first. A PrefixCache
// is safe for concurrent use: entries are immutable once published, the mutex
// guards the index and the LRU list (the lookup's prefix comparisons run
// under it, a few microseconds for 24 KB), and tokenization runs outside it.
type PrefixCache struct {
	tok           *Tokenizer
	seed          maphash.Seed
	maxBytes      int
	minNew        int
	spaceBoundary bool
	addedBoundary bool
	mu            sync.Mutex
	bytes         int
	lru           list.List               // of *prefixEntry, most recent at the front
	index         map[uint64]*prefixEntry // prefix hash at a checkpoint → newest entry holding it
}

// DefaultMinNewBytes is how much newly tokenized text makes a text worth
// caching. Below it the text is mostly a copy of the entry it reused, and the
// next request re-tokenizing those few bytes is cheaper than storing it.
const DefaultMinNewBytes = 1024

// checkpointStride is the inverse sampling rate of space checkpoints: one
// in this many qualifying spaces (about every 100 bytes of prose) is kept, so
// a request re-tokenizes at most that much of a shared prefix.
const checkpointStride = 16

type cpKind uint8

const (
	cpSpace cpKind = iota // a space after a non-whitespace rune; the space starts the next piece
	cpAdded               // the end of an added token
	// cpFinal is the end of the text. It only applies to an identical text,
	// because the last pre-token could grow with more text.
	cpFinal
)

type checkpoint struct {
	pos  int    // byte offset in the text
	ntok int    // tokens encoding text[:pos]
	hash uint64 // of text[:pos]
	kind cpKind
}

// validFor reports whether a checkpoint of a cached text is also one of a
// text that shares its first common bytes (and has length n).
func (cp checkpoint) validFor(common, n int) bool {
	switch cp.kind {
	case cpSpace:
		return cp.pos < common // the space itself must be shared
	case cpAdded:
		return cp.pos <= common
	default:
		return cp.pos == common && common == n
	}
}

type prefixEntry struct {
	text string
	ids  []int32
	cps  []checkpoint
	elem *list.Element
}

func (e *prefixEntry) size() int { return len(e.text) + 4*len(e.ids) + 32*len(e.cps) }

// NewPrefixCache returns a cache over t holding at most maxBytes.
func NewPrefixCache(t *Tokenizer, maxBytes int) *PrefixCache {
	c := &PrefixCache{
		tok:           t,
		seed:          maphash.MakeSeed(),
		maxBytes:      maxBytes,
		minNew:        DefaultMinNewBytes,
		addedBoundary: t.addedBoundaries,
		spaceBoundary: true,
		index:         make(map[uint64]*prefixEntry),
	}
	for s := range t.added.ids {
		if strings.ContainsRune(s, ' ') {
			c.spaceBoundary = false
		}
	}
	return c
}

// Encode returns the same ids as c's Tokenizer.Encode(text), reusing the
// tokenization of the longest cached prefix. The slice belongs to the caller.
func (c *PrefixCache) Encode(text string) []int {
	return c.AppendEncode(make([]int, 0, len(text)/4+1), text)
}

// AppendEncode appends the ids of text to dst, like Encode.
func (c *PrefixCache) AppendEncode(dst []int, text string) []int {
	base := len(dst)
	e, hit := c.reuse(text)
	start := 0
	if e != nil {
		cp := e.cps[hit]
		for _, id := range e.ids[:cp.ntok] {
			dst = append(dst, int(id))
		}
		if cp.kind == cpFinal {
			return dst
		}
		start = cp.pos
	}
	if len(text)-start < c.minNew {
		return c.tok.AppendEncode(dst, text[start:])
	}
	// Worth caching: encode the rest piece by piece so that the new entry
	// knows the token count at each of its checkpoints. Checkpoints of the
	// shared prefix are the entry's: they depend only on the prefix.
	var cps []checkpoint
	if e != nil {
		cps = append(make([]checkpoint, 0, hit+1+(len(text)-start)/64+2), e.cps[:hit+1]...)
	}
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(text[:start])
	for sc := c.scanner(text, start); ; {
		cp, ok := sc.next()
		if !ok {
			break
		}
		dst = c.tok.AppendEncode(dst, text[start:cp.pos])
		h.WriteString(text[start:cp.pos])
		cp.ntok, cp.hash = len(dst)-base, h.Sum64()
		cps = append(cps, cp)
		start = cp.pos
	}
	c.store(text, dst[base:], cps)
	return dst
}

// reuse finds the cached text sharing the longest checkpointed prefix with
// text and returns it with the index of that checkpoint, or nil.
//
// Candidates are found through the prefix-hash index one checkpoint beyond
// what is already matched, and every candidate is compared byte for byte, so
// a hash collision costs time, never correctness. Entries are immutable, so
// the caller may read the result after the lock is released.
func (c *PrefixCache) reuse(text string) (*prefixEntry, int) {
	var (
		best   *prefixEntry
		bestCP = -1
	)
	c.mu.Lock()
	defer c.mu.Unlock()
	for sc := c.scanner(text, 0); ; {
		cp, ok := sc.next()
		if !ok {
			break
		}
		e, ok := c.index[maphash.String(c.seed, text[:cp.pos])]
		if !ok {
			break
		}
		common := commonPrefixLen(e.text, text)
		j := sort.Search(len(e.cps), func(i int) bool { return e.cps[i].pos > common }) - 1
		for j >= 0 && !e.cps[j].validFor(common, len(text)) {
			j--
		}
		if j < 0 || (best != nil && e.cps[j].pos <= best.cps[bestCP].pos) {
			break
		}
		best, bestCP = e, j
		if e.cps[j].kind == cpFinal {
			break
		}
		sc = c.scanner(text, e.cps[j].pos)
	}
	if best != nil {
		c.lru.MoveToFront(best.elem)
	}
	return best, bestCP
}

// commonPrefixLen returns the length of the longest common prefix of a and b.
func commonPrefixLen(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i+64 <= n && a[i:i+64] == b[i:i+64] {
		i += 64
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// cpScanner yields the checkpoints of a text in order, the final one last.
// It remembers the next space checkpoint across calls so that a run of added
// tokens without spaces is not rescanned for spaces each time.
type cpScanner struct {
	c         *PrefixCache
	text      string
	pos       int
	nextSpace int // -1: none left; valid only while > pos
}

func (c *PrefixCache) scanner(text string, from int) *cpScanner {
	return &cpScanner{c: c, text: text, pos: from, nextSpace: from}
}

// next returns the next checkpoint (hash and ntok unset); ok is false past
// the end.
func (s *cpScanner) next() (checkpoint, bool) {
	text, from := s.text, s.pos
	if from >= len(text) {
		return checkpoint{}, false
	}
	end := len(text)
	if s.c.spaceBoundary {
		if s.nextSpace >= 0 && s.nextSpace <= from {
			s.nextSpace = spaceCheckpoint(text, from+1)
		}
		if s.nextSpace >= 0 {
			end = s.nextSpace
		}
	}
	cp := checkpoint{pos: end, kind: cpFinal}
	if end < len(text) {
		cp.kind = cpSpace
	}
	if s.c.addedBoundary {
		// A match cannot start before from: it would cover the checkpoint
		// at from, but added tokens contain neither spaces nor each other.
		if at, n, _ := s.c.tok.added.find(text[from:end]); n > 0 {
			cp = checkpoint{pos: from + at + n, kind: cpAdded}
		}
	}
	s.pos = cp.pos
	return cp, true
}

// spaceCheckpoint returns the first sampled space checkpoint at or after
// from, or -1: a space that follows a non-whitespace rune.
func spaceCheckpoint(text string, from int) int {
	for p := max(from, 1); p < len(text); p++ {
		if text[p] != ' ' || !sampled(text, p) {
			continue
		}
		if b := text[p-1]; b < utf8.RuneSelf {
			if asciiClass[b] == clsSpace || asciiClass[b] == clsNewline {
				continue
			}
		} else if r, _ := utf8.DecodeLastRuneInString(text[:p]); classOf(r) == clsSpace {
			continue
		}
		return p
	}
	return -1
}

// sampled picks about one in checkpointStride offsets by the bytes before p,
// so that equal text yields equal checkpoints.
func sampled(text string, p int) bool {
	var w uint64
	for i := max(0, p-6); i < p; i++ {
		w = w<<8 | uint64(text[i])
	}
	return (w*0x9E3779B97F4A7C15)>>59 < 32/checkpointStride
}

// store publishes a new entry and evicts old ones beyond the byte budget.
func (c *PrefixCache) store(text string, ids []int, cps []checkpoint) {
	e := &prefixEntry{text: strings.Clone(text), ids: make([]int32, len(ids)), cps: cps}
	for i, id := range ids {
		e.ids[i] = int32(id)
	}
	if e.size() > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e.elem = c.lru.PushFront(e)
	c.bytes += e.size()
	for _, cp := range cps {
		c.index[cp.hash] = e
	}
	for c.bytes > c.maxBytes {
		old := c.lru.Remove(c.lru.Back()).(*prefixEntry)
		c.bytes -= old.size()
		for _, cp := range old.cps {
			if c.index[cp.hash] == old {
				delete(c.index, cp.hash)
			}
		}
	}
}
