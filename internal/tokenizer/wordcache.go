package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync"
)

// wordCache memoises BPE results per pre-token. Natural text reuses a small
// set of words, so most lookups hit and skip BPE entirely.
//
// It is sharded to keep lock hold times short under concurrent Encode calls.
// Each shard holds at most shardCap words; a full shard is simply emptied,
// which needs no per-entry bookkeeping and refills with hot words at once.
type wordCache struct {
	seed   maphash.Seed
	shards [wordCacheShards]wordShard
}

const (
	wordCacheShards = 16
	// maxCachedWord keeps pathological pre-tokens (megabyte whitespace runs)
	// from pinning memory.
	maxCachedWord = 64
)

type wordShard struct {
	mu  sync.Mutex
	cap int
	m   map[string][]int32
}

func newWordCache(capacity int) *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	per := max(capacity/wordCacheShards, 1)
	for i := range c.shards {
		c.shards[i].cap = per
		c.shards[i].m = make(map[string][]int32)
	}
	return c
}

func (c *wordCache) shard(word string) *wordShard {
	return &c.shards[maphash.String(c.seed, word)%wordCacheShards]
}

// appendCached appends the cached ids of word and reports whether it had them.
func (c *wordCache) appendCached(dst []int, word string) ([]int, bool) {
	s := c.shard(word)
	s.mu.Lock()
	ids, ok := s.m[word]
	s.mu.Unlock()
	if !ok {
		return dst, false
	}
	for _, id := range ids {
		dst = append(dst, int(id))
	}
	return dst, true
}

func (c *wordCache) put(word string, ids []int) {
	v := make([]int32, len(ids))
	for i, id := range ids {
		v[i] = int32(id)
	}
	// Clone: word is a slice of the caller's (possibly huge) text.
	key := strings.Clone(word)
	s := c.shard(word)
	s.mu.Lock()
	if len(s.m) >= s.cap {
		clear(s.m)
	}
	s.m[key] = v
	s.mu.Unlock()
}
